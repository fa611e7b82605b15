/*
 * microagent network benchmark, guest side (`cargo xtask bench net`):
 *
 *   netbench send IP PORT KIB   connect, send KIB KiB, print the time
 *   netbench rtt IP PORT N      connect, N one-byte round trips to an echo
 *                               server, print the median and the fastest
 *   netbench conn IP PORT N     N connections opened (handshake done) and
 *                               closed, print the median and the fastest
 *
 * Times are the guest's CLOCK_MONOTONIC, in microseconds, one line of
 * `key=value` pairs the host side parses. Built against nolibc.
 */
#define AF_INET 2
#define SOCK_STREAM 1
#define IPPROTO_TCP 6
#define TCP_NODELAY 1
#define CHUNK (64 << 10)
#define MAX_RTT 4096

struct sockaddr_in {
	unsigned short sin_family;
	unsigned short sin_port;
	unsigned int sin_addr;
	unsigned char sin_zero[8];
};

static unsigned char buf[CHUNK];
static long rtts[MAX_RTT];

static long now_us(void)
{
	struct timespec ts;

	my_syscall2(__NR_clock_gettime, 1 /* CLOCK_MONOTONIC */, &ts);
	return ts.tv_sec * 1000000L + ts.tv_nsec / 1000;
}

static int fail(const char *what)
{
	printf("netbench: %s failed (errno %d)\n", what, errno);
	exit(1);
	return 1;
}

/* a.b.c.d to network order; 0 when malformed. */
static unsigned int parse_ip(const char *s)
{
	unsigned int ip = 0, part = 0, dots = 0;

	for (; *s; s++) {
		if (*s == '.') {
			ip = ip | (part << (8 * dots));
			part = 0;
			dots++;
		} else if (*s >= '0' && *s <= '9') {
			part = part * 10 + (*s - '0');
		} else {
			return 0;
		}
	}
	return dots == 3 ? ip | (part << 24) : 0;
}

static int connect_to(const char *ip, int port)
{
	struct sockaddr_in addr = { AF_INET, 0, 0, {0} };
	int one = 1;
	int s = my_syscall3(__NR_socket, AF_INET, SOCK_STREAM, 0);

	if (s < 0)
		fail("socket");
	addr.sin_port = (unsigned short)(((port & 0xff) << 8) | ((port >> 8) & 0xff));
	addr.sin_addr = parse_ip(ip);
	if (!addr.sin_addr)
		fail("parsing the address");
	if (my_syscall3(__NR_connect, s, &addr, sizeof(addr)) < 0)
		fail("connect");
	my_syscall5(__NR_setsockopt, s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	return s;
}

/* Sorts n times and prints their median and fastest as `key=value`s. */
static void print_times(const char *what, long *t, int n)
{
	int i, j;

	/* Insertion sort: n is small. */
	for (i = 1; i < n; i++)
		for (j = i; j > 0 && t[j - 1] > t[j]; j--) {
			long x = t[j];

			t[j] = t[j - 1];
			t[j - 1] = x;
		}
	printf("%s=%d median_us=%ld min_us=%ld\n", what, n, t[n / 2], t[0]);
}

static void send_all(int s, const unsigned char *p, long n)
{
	while (n > 0) {
		long w = write(s, p, n);

		if (w <= 0)
			fail("write");
		p += w;
		n -= w;
	}
}

int main(int argc, char **argv)
{
	long t0, t1;
	int s;

	if (argc != 5) {
		printf("usage: netbench send|rtt|conn IP PORT KIB|N\n");
		return 2;
	}
	if (!strcmp(argv[1], "conn")) {
		int n = atoi(argv[4]), i;

		if (n < 1 || n > MAX_RTT)
			fail("N (1 to 4096)");
		for (i = 0; i < n; i++) {
			t0 = now_us();
			s = connect_to(argv[2], atoi(argv[3]));
			rtts[i] = now_us() - t0;
			close(s);
		}
		print_times("conns", rtts, n);
		return 0;
	}
	s = connect_to(argv[2], atoi(argv[3]));
	if (!strcmp(argv[1], "send")) {
		long left = (long)atoi(argv[4]) << 10;
		long total = left;

		t0 = now_us();
		while (left > 0) {
			long n = left < CHUNK ? left : CHUNK;

			send_all(s, buf, n);
			left -= n;
		}
		/* The host's sink closes after reading everything. */
		my_syscall2(__NR_shutdown, s, 1 /* SHUT_WR */);
		while (read(s, buf, 1) > 0)
			;
		t1 = now_us();
		printf("bytes=%ld us=%ld\n", total, t1 - t0);
		return 0;
	}
	if (!strcmp(argv[1], "rtt")) {
		int n = atoi(argv[4]), i;

		if (n < 1 || n > MAX_RTT)
			fail("N (1 to 4096)");
		for (i = 0; i < n; i++) {
			t0 = now_us();
			send_all(s, buf, 1);
			if (read(s, buf, 1) != 1)
				fail("read");
			rtts[i] = now_us() - t0;
		}
		print_times("rtts", rtts, n);
		return 0;
	}
	printf("netbench: unknown mode %s\n", argv[1]);
	return 2;
}
