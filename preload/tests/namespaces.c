/* ci/preload.sh: a single-threaded program that enters namespaces the way `nsenter`
 * and `unshare -U` do, run with and without LD_PRELOAD=libscalemem.so. Linux refuses
 * unshare(CLONE_NEWUSER) and setns into a user or mount namespace to a process with a
 * second thread (EINVAL); the library starts a maintenance thread, so its unshare and
 * setns must stop that thread around the call (and start it again after).
 *
 *   cc -O2 -Wall -o namespaces preload/tests/namespaces.c
 *   NAMESPACES_THREADS=2 LD_PRELOAD=target/release/libscalemem.so ./namespaces
 *
 * NAMESPACES_THREADS: how many threads the process must have at start and again after
 * each call (waits up to 2 s at start; default 1). Exit status 0 when every call
 * succeeded, 77 when the machine refuses namespaces to a process with no other thread
 * (a forked child: the environment, not the library), 1 otherwise. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

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

static int want_threads;

static int check_threads(const char *when)
{
	int n = threads();
	if (n != want_threads) {
		printf("FAIL %d threads %s, want %d\n", n, when, want_threads);
		return 1;
	}
	return 0;
}

/* Whether a process with no other thread may make user and mount namespaces here:
 * a forked child (the library's thread does not survive fork) tries. */
static int namespaces_allowed(void)
{
	pid_t pid = fork();
	if (pid == 0)
		_exit(unshare(CLONE_NEWUSER | CLONE_NEWNS) == 0 ? 0 : 1);
	int status = 0;
	return pid > 0 && waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

static int write_file(const char *path, const char *text)
{
	int fd = open(path, O_WRONLY | O_CLOEXEC);
	ssize_t n = fd < 0 ? -1 : write(fd, text, strlen(text));
	if (fd >= 0)
		close(fd);
	return n == (ssize_t)strlen(text);
}

/* Maps root of the calling process's new user namespace to `uid`/`gid` outside it. */
static int map_ids(uid_t uid, gid_t gid)
{
	char line[64];
	int ok = write_file("/proc/self/setgroups", "deny");
	snprintf(line, sizeof line, "0 %u 1", (unsigned)uid);
	ok = ok && write_file("/proc/self/uid_map", line);
	snprintf(line, sizeof line, "0 %u 1", (unsigned)gid);
	return ok && write_file("/proc/self/gid_map", line);
}

static int same_ns(const char *kind, pid_t other)
{
	char a[64], b[64], path[64];
	ssize_t n, m;
	snprintf(path, sizeof path, "/proc/self/ns/%s", kind);
	n = readlink(path, a, sizeof a - 1);
	snprintf(path, sizeof path, "/proc/%d/ns/%s", (int)other, kind);
	m = readlink(path, b, sizeof b - 1);
	return n > 0 && n == m && memcmp(a, b, (size_t)n) == 0;
}

int main(void)
{
	const char *env = getenv("NAMESPACES_THREADS");
	want_threads = env ? atoi(env) : 1;
	for (int i = 0; i < 200 && threads() < want_threads; i++)
		nanosleep(&(struct timespec){ .tv_nsec = 10 * 1000 * 1000 }, NULL);
	if (check_threads("at start"))
		return 1;
	if (!namespaces_allowed()) {
		printf("SKIP user and mount namespaces are refused here even to a single-threaded process\n");
		return 77;
	}
	int failed = 0;

	/* setns, as nsenter does: into a child's mount namespace, then its user namespace. */
	int ready[2], hold[2];
	if (pipe(ready) || pipe(hold))
		return 1;
	uid_t uid = geteuid();
	gid_t gid = getegid();
	pid_t child = fork();
	if (child == 0) {
		/* Its own ids mapped, so that the parent, once in this namespace, may make a
		 * user namespace of its own inside it (below). */
		char c = unshare(CLONE_NEWUSER | CLONE_NEWNS) == 0 && map_ids(uid, gid) ? 'y' : 'n';
		if (write(ready[1], &c, 1) != 1)
			_exit(1);
		/* Stay until the parent has joined (its end of `hold` closes). */
		close(hold[1]);
		(void)read(hold[0], &c, 1);
		_exit(0);
	}
	close(hold[0]);
	char c = 0;
	if (child < 0 || read(ready[0], &c, 1) != 1 || c != 'y') {
		printf("FAIL the child could not make its namespaces\n");
		return 1;
	}
	char path[64];
	snprintf(path, sizeof path, "/proc/%d/ns/mnt", (int)child);
	int mnt = open(path, O_RDONLY | O_CLOEXEC);
	snprintf(path, sizeof path, "/proc/%d/ns/user", (int)child);
	int user = open(path, O_RDONLY | O_CLOEXEC);
	if (mnt < 0 || user < 0) {
		printf("FAIL open /proc/%d/ns: %s\n", (int)child, strerror(errno));
		return 1;
	}
	if (setns(mnt, CLONE_NEWNS) != 0) {
		printf("FAIL setns(mount namespace): %s\n", strerror(errno));
		failed = 1;
	} else if (!same_ns("mnt", child)) {
		printf("FAIL setns(mount namespace) returned 0 but /proc/self/ns/mnt did not change\n");
		failed = 1;
	}
	failed |= check_threads("after setns(mount)");
	if (setns(user, CLONE_NEWUSER) != 0) {
		printf("FAIL setns(user namespace): %s\n", strerror(errno));
		failed = 1;
	} else if (!same_ns("user", child)) {
		printf("FAIL setns(user namespace) returned 0 but /proc/self/ns/user did not change\n");
		failed = 1;
	}
	failed |= check_threads("after setns(user)");
	close(hold[1]);
	waitpid(child, NULL, 0);

	/* unshare, as `unshare -U -m` does: a user namespace of our own, then a mount one. */
	if (unshare(CLONE_NEWUSER) != 0) {
		printf("FAIL unshare(CLONE_NEWUSER): %s\n", strerror(errno));
		failed = 1;
	}
	failed |= check_threads("after unshare(CLONE_NEWUSER)");
	if (unshare(CLONE_NEWNS) != 0) {
		printf("FAIL unshare(CLONE_NEWNS): %s\n", strerror(errno));
		failed = 1;
	}
	failed |= check_threads("after unshare(CLONE_NEWNS)");

	/* Failures keep the kernel's errno through the thread's restart. */
	errno = 0;
	if (unshare(-1) != -1 || errno != EINVAL) {
		printf("FAIL unshare(-1): errno %d, want EINVAL\n", errno);
		failed = 1;
	}
	errno = 0;
	if (setns(-1, 0) != -1 || errno != EBADF) {
		printf("FAIL setns(-1, 0): errno %d, want EBADF\n", errno);
		failed = 1;
	}
	failed |= check_threads("after the failed calls");

	/* The allocator still serves the process in its new namespaces. */
	for (int i = 0; i < 10000; i++) {
		char *p = malloc((size_t)(i % 5000) + 1);
		if (!p)
			return 1;
		p[0] = (char)i;
		free(p);
	}
	if (!failed)
		printf("ok: setns into a mount and a user namespace, unshare of both, errno kept, %d thread(s) after each\n",
		       want_threads);
	return failed;
}
