/*
 * microagent test init: prints a marker, runs `uname -a` as a child process,
 * and reboots (which ends the VM). Built against the kernel's nolibc, so it
 * is a few KB: every page and every process costs seconds on emulating hosts.
 */
#define MARKER "MICROAGENT-INIT-OK"

static void say(const char *s)
{
	write(1, s, strlen(s));
}

int main(int argc, char **argv, char **envp)
{
	char *uname_argv[] = { "uname", "-a", 0 };
	int status = 0;
	pid_t pid;

	(void)argc;
	(void)argv;
	say("\n" MARKER " pid=1\n");
	pid = fork();
	if (pid == 0) {
		execve("/bin/uname", uname_argv, envp);
		say("init: execve /bin/uname failed\n");
		exit(127);
	}
	if (pid < 0)
		say("init: fork failed\n");
	else if (waitpid(pid, &status, 0) < 0)
		say("init: waitpid failed\n");
	else if (status != 0)
		say("init: uname failed\n");
	else
		say(MARKER " done\n");
	reboot(LINUX_REBOOT_CMD_RESTART);
	say("init: reboot failed\n");
	for (;;)
		sleep(3600);
}
