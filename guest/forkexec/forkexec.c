/*
 * microagent exec floor (cargo xtask bench agent): how long a bare
 * fork + execve + waitpid of a program takes inside the guest, the least
 * any exec path (agent, CLI) can cost on this host.
 *
 *   forkexec COUNT PROGRAM
 *
 * runs PROGRAM (no arguments) COUNT times, one after the other, and prints
 * "forkexec: median N us min N us max N us". Built against nolibc.
 */

#define MAX_RUNS 100

static long now_us(void)
{
	struct timeval tv;

	gettimeofday(&tv, 0);
	return tv.tv_sec * 1000000L + tv.tv_usec;
}

int main(int argc, char **argv)
{
	long took[MAX_RUNS];
	int count;

	if (argc != 3) {
		printf("usage: forkexec COUNT PROGRAM\n");
		return 2;
	}
	count = atoi(argv[1]);
	if (count < 1 || count > MAX_RUNS) {
		printf("forkexec: COUNT must be 1 to %d\n", MAX_RUNS);
		return 2;
	}
	for (int i = 0; i < count; i++) {
		char *args[] = { argv[2], 0 };
		char *env[] = { 0 };
		int status = 0;
		long start = now_us();
		pid_t pid = fork();

		if (pid < 0) {
			printf("forkexec: fork failed\n");
			return 2;
		}
		if (pid == 0) {
			execve(argv[2], args, env);
			exit(127);
		}
		if (waitpid(pid, &status, 0) < 0 || status != 0) {
			printf("forkexec: %s failed (status %d)\n", argv[2], status);
			return 2;
		}
		took[i] = now_us() - start;
	}
	/* insertion sort: at most 100 values */
	for (int i = 1; i < count; i++) {
		long v = took[i];
		int j = i - 1;

		while (j >= 0 && took[j] > v) {
			took[j + 1] = took[j];
			j--;
		}
		took[j + 1] = v;
	}
	printf("forkexec: median %ld us min %ld us max %ld us\n", took[count / 2], took[0], took[count - 1]);
	return 0;
}
