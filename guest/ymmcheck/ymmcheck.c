/*
 * microagent extended FPU state switch check (issue 10, docs/host-compat.md):
 * do the YMM upper halves, and where user mode has AVX-512 the opmask and
 * ZMM registers, survive other processes running?
 *
 *   ymmcheck PROCS CHECKS
 *
 * forks PROCS processes; each loads a pattern made of its pid into ymm2
 * (and zmm3, ymm17 and k1), spins about 10 ms (so the kernel switches to the
 * others meanwhile), stores them and compares, CHECKS times. Prints what it
 * found and exits 1 when any check read another value. Where user mode
 * cannot use AVX there is nothing to switch: it says so and exits 0. Built
 * against nolibc.
 */

static void cpuid(unsigned leaf, unsigned sub, unsigned *a, unsigned *b, unsigned *c, unsigned *d)
{
	__asm__ volatile("cpuid" : "=a"(*a), "=b"(*b), "=c"(*c), "=d"(*d) : "a"(leaf), "c"(sub));
}

static unsigned long xcr0(void)
{
	unsigned lo, hi;

	__asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
	return ((unsigned long)hi << 32) | lo;
}

/* Bad checks of the AVX-512 registers out of `checks`: zmm3 (its upper
 * 256 bits are ZMM_Hi256), ymm17 (Hi16_ZMM) and k1 (opmask). */
__attribute__((target("avx512f,avx512bw,avx512vl")))
static int hold_avx512(const unsigned char *want, int checks)
{
	unsigned char got3[64] __attribute__((aligned(64)));
	unsigned char got17[32] __attribute__((aligned(32)));
	unsigned long kwant = 0x6b31000000000000ul | (unsigned)getpid(), kgot;
	int bad = 0;

	for (int n = 0; n < checks; n++) {
		__asm__ volatile(
			"vmovdqu64 (%[want]), %%zmm3\n"
			"vmovdqu64 (%[want]), %%ymm17\n"
			"kmovq %[kwant], %%k1\n"
			"mov $30000000, %%ecx\n"
			"1: dec %%ecx\n"
			"jnz 1b\n"
			"vmovdqu64 %%zmm3, %[got3]\n"
			"vmovdqu64 %%ymm17, %[got17]\n"
			"kmovq %%k1, %[kgot]\n"
			"vzeroupper\n"
			: [got3] "=m"(got3), [got17] "=m"(got17), [kgot] "=r"(kgot)
			: [want] "r"(want), [kwant] "r"(kwant)
			: "rcx", "xmm3", "xmm17", "k1", "memory");
		if (memcmp(want, got3, 64) != 0 || memcmp(want, got17, 32) != 0 || kgot != kwant)
			bad++;
	}
	return bad;
}

/* Bad checks out of `checks` for this process. */
static int hold(int checks)
{
	unsigned char want[32] __attribute__((aligned(32)));
	unsigned char got[32] __attribute__((aligned(32)));
	unsigned pid = getpid();
	int bad = 0;

	for (int i = 0; i < 32; i++)
		want[i] = (unsigned char)(pid >> (8 * (i % 4))) ^ (unsigned char)(0x5a + i);
	for (int n = 0; n < checks; n++) {
		__asm__ volatile(
			"vmovdqu %[want], %%ymm2\n"
			"mov $30000000, %%ecx\n"
			"1: dec %%ecx\n"
			"jnz 1b\n"
			"vmovdqu %%ymm2, %[got]\n"
			"vzeroupper\n"
			: [got] "=m"(got)
			: [want] "m"(want)
			: "rcx", "xmm2", "memory");
		if (memcmp(want, got, 32) != 0)
			bad++;
	}
	return bad;
}

int main(int argc, char **argv)
{
	unsigned a, b, c, d;
	int procs, checks, bad = 0, avx512;

	if (argc != 3) {
		printf("usage: ymmcheck PROCS CHECKS\n");
		return 2;
	}
	procs = atoi(argv[1]);
	checks = atoi(argv[2]);
	cpuid(1, 0, &a, &b, &c, &d);
	/* OSXSAVE (27) and AVX (28); XCR0 must enable SSE and AVX state. */
	if (!(c & (1u << 27)) || !(c & (1u << 28)) || (xcr0() & 6) != 6) {
		printf("ymmcheck: AVX is not usable in user mode here; nothing to switch\n");
		return 0;
	}
	/* AVX512F (16), AVX512BW (30), AVX512VL (31); XCR0 opmask, ZMM_Hi256, Hi16_ZMM. */
	cpuid(7, 0, &a, &b, &c, &d);
	avx512 = (b & (1u << 16)) && (b & (1u << 30)) && (b & (1u << 31)) && (xcr0() & 0xe0) == 0xe0;
	for (int p = 0; p < procs; p++) {
		pid_t pid = fork();

		if (pid < 0) {
			printf("ymmcheck: fork failed\n");
			return 2;
		}
		if (pid == 0) {
			unsigned char want[64] __attribute__((aligned(64)));
			int n = hold(checks);

			for (int i = 0; i < 64; i++)
				want[i] = (unsigned char)(getpid() >> (8 * (i % 4))) ^ (unsigned char)(0xa5 + i);
			if (avx512)
				n += hold_avx512(want, checks);

			printf("ymmcheck: process %d: %d of %d checks bad\n", getpid(), n, checks);
			return n > 255 ? 255 : n;
		}
	}
	for (int p = 0; p < procs; p++) {
		int status = 0;

		if (waitpid(-1, &status, 0) < 0) {
			printf("ymmcheck: waitpid failed\n");
			return 2;
		}
		if ((status & 0x7f) != 0) {
			printf("ymmcheck: a process died of signal %d\n", status & 0x7f);
			return 2;
		}
		bad += (status >> 8) & 0xff;
	}
	printf("ymmcheck: %d processes x %d checks%s, XCR0=%lx: %d bad\n", procs, checks,
	       avx512 ? " (YMM and AVX-512)" : " (YMM)", xcr0(), bad);
	return bad ? 1 : 0;
}
