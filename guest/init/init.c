/*
 * microagent guest init (/sbin/init of the workspace images).
 *
 * The kernel mounts the read-only base image (/dev/vda) as /. This init:
 *   1. mounts a writable layer: the ext4 disk named by `microagent_overlay=`
 *      on the kernel command line (the per-workspace disk, e.g. /dev/vdb),
 *      or a tmpfs when none is given (writes then live in RAM only);
 *   2. mounts an overlay of the base and that layer and pivots into it
 *      (the old root is then detached: the base is reachable only as the
 *      overlay's lower layer);
 *   3. mounts /proc, /sys, /dev, /dev/pts, /tmp and /run;
 *   4. sets the hostname from `microagent_hostname=` (default microagent);
 *   5. execs the guest agent, which becomes PID 1: it reaps every child and
 *      serves the host over vsock. No other process is started: each one
 *      costs about a second where guest kernel mode is emulated.
 * Unknown `key=value` kernel parameters without a dot reach init as
 * environment variables, which is how the two settings arrive.
 * In a converted container image this init is /.microagent/init (booted
 * with init=/.microagent/init): the agent and the writable layer's mount
 * point are then beside it, and the image's own files stay untouched.
 * Built against the kernel's nolibc: a few KB.
 */
#define AGENT "/usr/bin/microagent-agent"
#define GUEST_DIR "/.microagent/"
#define MS_RDONLY 1
#define MS_NOSUID 2
#define MS_NODEV 4
#define MS_NOEXEC 8
#define MS_NOATIME 1024
#define MNT_DETACH 2

static void say(const char *s)
{
	write(2, s, strlen(s));
}

static void die(const char *what)
{
	say("microagent-init: ");
	say(what);
	say(" failed; powering off\n");
	my_syscall0(__NR_sync);
	reboot(LINUX_REBOOT_CMD_RESTART);
	for (;;)
		sleep(3600);
}

static const char *env_value(char **envp, const char *key)
{
	size_t n = strlen(key);

	for (; *envp; envp++)
		if (strncmp(*envp, key, n) == 0 && (*envp)[n] == '=')
			return *envp + n + 1;
	return 0;
}

static void must_mount(const char *src, const char *dst, const char *type, unsigned long flags, const char *data)
{
	mkdir(dst, 0755);
	if (mount(src, dst, type, flags, data) < 0) {
		say("microagent-init: mount ");
		say(dst);
		say("\n");
		die("mount");
	}
}

int main(int argc, char **argv, char **envp)
{
	const char *layer = env_value(envp, "microagent_overlay");
	const char *hostname = env_value(envp, "microagent_hostname");
	char *agent_argv[] = { "microagent-agent", 0 };
	char *agent_envp[] = { "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root", 0 };
	/* Converted images: everything of ours under /.microagent/. */
	int ours = argc > 0 && strncmp(argv[0], GUEST_DIR, strlen(GUEST_DIR)) == 0;
	const char *agent = ours ? GUEST_DIR "agent" : AGENT;
	const char *top = ours ? GUEST_DIR "overlay" : "/overlay";
	const char *upper = ours ? GUEST_DIR "overlay/upper" : "/overlay/upper";
	const char *work = ours ? GUEST_DIR "overlay/work" : "/overlay/work";
	const char *merged = ours ? GUEST_DIR "overlay/merged" : "/overlay/merged";
	const char *oldroot = ours ? GUEST_DIR "overlay/merged/.oldroot" : "/overlay/merged/.oldroot";
	const char *options = ours ?
		"lowerdir=/,upperdir=" GUEST_DIR "overlay/upper,workdir=" GUEST_DIR "overlay/work" :
		"lowerdir=/,upperdir=/overlay/upper,workdir=/overlay/work";

	/* The writable layer, at the read-only base's empty overlay dir. */
	if (layer && *layer)
		must_mount(layer, top, "ext4", MS_NOATIME, "");
	else
		must_mount("tmpfs", top, "tmpfs", MS_NOATIME, "mode=0755");
	mkdir(upper, 0755);
	mkdir(work, 0755);
	must_mount("overlay", merged, "overlay", MS_NOATIME, options);
	mkdir(oldroot, 0700);
	if (my_syscall2(__NR_pivot_root, merged, oldroot) < 0)
		die("pivot_root");
	if (chdir("/") < 0)
		die("chdir /");
	must_mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, "");
	must_mount("sysfs", "/sys", "sysfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "");
	must_mount("devtmpfs", "/dev", "devtmpfs", MS_NOSUID, "mode=0755");
	must_mount("devpts", "/dev/pts", "devpts", MS_NOSUID | MS_NOEXEC, "gid=5,mode=620,ptmxmode=666");
	must_mount("tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777");
	must_mount("tmpfs", "/run", "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755");
	/* The old root (base view and the layer's mount) is reachable through the overlay only. */
	if (umount2("/.oldroot", MNT_DETACH) == 0)
		my_syscall1(__NR_rmdir, "/.oldroot");
	if (!hostname || !*hostname)
		hostname = "microagent";
	my_syscall2(__NR_sethostname, hostname, strlen(hostname));
	execve(agent, agent_argv, agent_envp);
	die("exec of the agent");
	return 1;
}
