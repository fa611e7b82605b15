/*
 * microagent device test init (PID 1 of the ext4 test root filesystem).
 * Exercises the virtio devices from inside the guest, printing progress
 * markers on the console for the host side of the test:
 *   1. mounts the second disk (/dev/vdb, ext4) and writes a file on it;
 *   2. vsock, host-initiated: listens on port 5000 and echoes 1 MiB;
 *   3. vsock, guest-initiated: connects to host port 6000, sends 1 MiB in
 *      64 KiB steps and checks that each step comes back byte-exact;
 * then syncs and reboots (which ends the VM). Built against nolibc.
 *
 * With the argument `bench` (kernel command line `init=/init -- bench`) it
 * instead times a sequential O_DIRECT read of all of /dev/vdb and prints the
 * figure, then echoes everything on vsock port 5000 until the host closes.
 */
#define MARK "MICROAGENT-DEVTEST"
#define AF_VSOCK 40
#define SOCK_STREAM 1
#define VMADDR_CID_ANY 0xffffffffU
#define VMADDR_CID_HOST 2
#define TOTAL (1 << 20)
#define STEP (64 << 10)

struct sockaddr_vm {
	unsigned short svm_family;
	unsigned short svm_reserved1;
	unsigned int svm_port;
	unsigned int svm_cid;
	unsigned char svm_flags;
	unsigned char svm_zero[3];
};

static unsigned char out_buf[STEP];
static unsigned char in_buf[STEP];

static void say(const char *s)
{
	write(1, s, strlen(s));
}

static void finish(void)
{
	my_syscall0(__NR_sync);
	reboot(LINUX_REBOOT_CMD_RESTART);
	for (;;)
		sleep(3600);
}

static void fail(const char *what)
{
	say(MARK " FAIL ");
	say(what);
	say("\n");
	finish();
}

static int write_all(int fd, const unsigned char *p, long n)
{
	while (n > 0) {
		long w = write(fd, p, n);
		if (w <= 0)
			return -1;
		p += w;
		n -= w;
	}
	return 0;
}

static int read_all(int fd, unsigned char *p, long n)
{
	while (n > 0) {
		long r = read(fd, p, n);
		if (r <= 0)
			return -1;
		p += r;
		n -= r;
	}
	return 0;
}

/* The byte at offset `off` of a test stream: both sides compute it. */
static unsigned char pattern(unsigned long off)
{
	return (unsigned char)(off * 131 + (off >> 8) * 7 + 1);
}

static int vsock_socket(void)
{
	int s = my_syscall3(__NR_socket, AF_VSOCK, SOCK_STREAM, 0);
	if (s < 0)
		fail("socket(AF_VSOCK)");
	return s;
}

static void disk_test(void)
{
	static const char text[] = "written by the guest over virtio-blk\n";
	int fd;

	if (mount("/dev/vdb", "/mnt", "ext4", 0, "") < 0)
		fail("mount /dev/vdb");
	fd = open("/mnt/from-guest.txt", O_WRONLY | O_CREAT | O_TRUNC, 0644);
	if (fd < 0 || write_all(fd, (const unsigned char *)text, sizeof(text) - 1) < 0)
		fail("write /mnt/from-guest.txt");
	if (fsync(fd) < 0 || close(fd) < 0 || umount2("/mnt", 0) < 0)
		fail("sync /dev/vdb");
	say(MARK " disk-ok\n");
}

static void echo_test(void)
{
	struct sockaddr_vm addr = { .svm_family = AF_VSOCK, .svm_port = 5000, .svm_cid = VMADDR_CID_ANY };
	long total = 0;
	int s = vsock_socket(), c;

	if (my_syscall3(__NR_bind, s, &addr, sizeof(addr)) < 0 || my_syscall2(__NR_listen, s, 1) < 0)
		fail("bind/listen vsock port 5000");
	say(MARK " listening 5000\n");
	c = my_syscall3(__NR_accept, s, 0, 0);
	if (c < 0)
		fail("accept");
	while (total < TOTAL) {
		long n = read(c, in_buf, STEP);
		if (n <= 0 || write_all(c, in_buf, n) < 0)
			fail("echo");
		total += n;
	}
	close(c);
	close(s);
	say(MARK " echo-ok\n");
}

static void connect_test(void)
{
	struct sockaddr_vm addr = { .svm_family = AF_VSOCK, .svm_port = 6000, .svm_cid = VMADDR_CID_HOST };
	unsigned long off = 0, i;
	int s = vsock_socket();

	if (my_syscall3(__NR_connect, s, &addr, sizeof(addr)) < 0)
		fail("connect to host port 6000");
	while (off < TOTAL) {
		for (i = 0; i < STEP; i++)
			out_buf[i] = pattern(off + i);
		if (write_all(s, out_buf, STEP) < 0 || read_all(s, in_buf, STEP) < 0)
			fail("exchange with host port 6000");
		if (memcmp(out_buf, in_buf, STEP) != 0)
			fail("data from host port 6000 differs");
		off += STEP;
	}
	close(s);
	say(MARK " connect-ok\n");
}

static void say_num(unsigned long v)
{
	char buf[24];
	int i = sizeof(buf);

	buf[--i] = 0;
	do {
		buf[--i] = '0' + v % 10;
		v /= 10;
	} while (v && i > 0);
	say(buf + i);
}

static unsigned long now_ns(void)
{
	struct timespec ts;

	my_syscall2(__NR_clock_gettime, 1 /* CLOCK_MONOTONIC */, &ts);
	return ts.tv_sec * 1000000000UL + ts.tv_nsec;
}

/* 1 MiB, page aligned for O_DIRECT. */
static unsigned char big_buf[1 << 20] __attribute__((aligned(4096)));

static void bench(void)
{
	struct sockaddr_vm addr = { .svm_family = AF_VSOCK, .svm_port = 5000, .svm_cid = VMADDR_CID_ANY };
	unsigned long start, total = 0;
	long n;
	int fd = open("/dev/vdb", O_RDONLY | 040000 /* O_DIRECT */, 0), s, c;

	if (fd < 0)
		fail("open /dev/vdb");
	start = now_ns();
	while ((n = read(fd, big_buf, sizeof(big_buf))) > 0)
		total += n;
	if (n < 0)
		fail("read /dev/vdb");
	say(MARK " blk-read bytes=");
	say_num(total);
	say(" ns=");
	say_num(now_ns() - start);
	say("\n");
	close(fd);

	s = vsock_socket();
	if (my_syscall3(__NR_bind, s, &addr, sizeof(addr)) < 0 || my_syscall2(__NR_listen, s, 1) < 0)
		fail("bind/listen vsock port 5000");
	say(MARK " listening 5000\n");
	c = my_syscall3(__NR_accept, s, 0, 0);
	if (c < 0)
		fail("accept");
	while ((n = read(c, big_buf, sizeof(big_buf))) > 0)
		if (write_all(c, big_buf, n) < 0)
			fail("echo");
	say(MARK " done\n");
	finish();
}

int main(int argc, char **argv)
{
	if (argc > 1 && strcmp(argv[1], "bench") == 0)
		bench();
	say(MARK " start\n");
	disk_test();
	echo_test();
	connect_test();
	say(MARK " done\n");
	finish();
	return 0;
}
