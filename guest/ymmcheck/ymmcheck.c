/*
 * microagent YMM switch check (issue 10, docs/host-compat.md): do the upper
 * halves of the YMM registers survive other processes running?
 *
 *   ymmcheck PROCS CHECKS
 *
 * forks PROCS processes; each loads a pattern made of its pid into ymm2,
 * spins about 10 ms (so the kernel switches to the others meanwhile), stores
 * ymm2 and compares, CHECKS times. Prints what it found and exits 1 when any
 * check read another value. Where user mode cannot use AVX there is nothing
 * to switch: it says so and exits 0. Built against nolibc.
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
	int procs, checks, bad = 0;

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
	for (int p = 0; p < procs; p++) {
		pid_t pid = fork();

		if (pid < 0) {
			printf("ymmcheck: fork failed\n");
			return 2;
		}
		if (pid == 0) {
			int n = hold(checks);

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
	printf("ymmcheck: %d processes x %d checks, XCR0=%lx: %d bad\n", procs, checks, xcr0(), bad);
	return bad ? 1 : 0;
}
