/* ci/preload.sh: a single-threaded program that blocks signals and takes them itself
 * (sigwait, sigpending), run with and without LD_PRELOAD=libscalemem.so. The library
 * starts a maintenance thread; a process-directed signal that the program blocks must
 * stay pending for the program, not be delivered to that thread (where the program's
 * handler would run, or the default action end the process). Also calls setgid and
 * setuid, which glibc broadcasts to every thread with an internal signal: a background
 * thread that blocked that one too would hang them.
 *
 *   cc -O2 -Wall -pthread -o signals preload/tests/signals.c
 *   SIGNALS_THREADS=2 LD_PRELOAD=target/release/libscalemem.so ./signals
 *
 * SIGNALS_THREADS: how many threads the process must have at start (waits up to 2 s for
 * them; default 1). Exit status 0 when every signal was still pending. */
#define _GNU_SOURCE
#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static volatile sig_atomic_t handled;

static void handler(int sig)
{
	(void)sig;
	handled++;
}

static int threads(void)
{
	DIR *d = opendir("/proc/self/task");
	int n = 0;
	if (!d)
		return -1;
	for (struct dirent *e; (e = readdir(d));)
		n += e->d_name[0] != '.';
	closedir(d);
	return n;
}

int main(void)
{
	const char *want = getenv("SIGNALS_THREADS");
	int expect = want ? atoi(want) : 1;
	free(malloc(64));
	for (int i = 0; i < 200 && threads() < expect; i++) {
		struct timespec ts = {0, 10 * 1000 * 1000};
		nanosleep(&ts, NULL);
	}
	if (threads() < expect) {
		fprintf(stderr, "signals: %d threads, expected %d\n", threads(), expect);
		return 2;
	}
	const int sigs[] = {SIGUSR1, SIGUSR2, SIGTERM, SIGINT, SIGHUP, SIGALRM};
	const int nsigs = (int)(sizeof sigs / sizeof sigs[0]);
	sigset_t set;
	sigemptyset(&set);
	for (int i = 0; i < nsigs; i++) {
		struct sigaction sa;
		memset(&sa, 0, sizeof sa);
		sa.sa_handler = handler;
		sigaction(sigs[i], &sa, NULL);
		sigaddset(&set, sigs[i]);
	}
	sigprocmask(SIG_BLOCK, &set, NULL);
	int lost = 0;
	for (int round = 0; round < 50; round++) {
		for (int i = 0; i < nsigs; i++) {
			kill(getpid(), sigs[i]);
			struct timespec ts = {0, 200 * 1000};
			nanosleep(&ts, NULL);
			sigset_t pending;
			sigpending(&pending);
			if (!sigismember(&pending, sigs[i])) {
				lost++;
				continue;
			}
			int got = 0;
			sigset_t one;
			sigemptyset(&one);
			sigaddset(&one, sigs[i]);
			if (sigwait(&one, &got) != 0 || got != sigs[i]) {
				fprintf(stderr, "signals: sigwait failed for %d\n", sigs[i]);
				return 1;
			}
		}
	}
	/* glibc's setxid broadcast reaches every thread (a thread that cannot take it
	 * would make these hang: ci/preload.sh runs this under a timeout). */
	if (setgid(getgid()) != 0 || setuid(getuid()) != 0) {
		perror("signals: setgid/setuid");
		return 1;
	}
	printf("signals: %d threads, %d of %d blocked signals taken by another thread, handler ran %d times\n",
	       threads(), lost, 50 * nsigs, (int)handled);
	return lost != 0 || handled != 0;
}
