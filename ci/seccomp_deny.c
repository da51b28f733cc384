/*
 * seccomp_deny SYSCALL... -- CMD [ARGS]: runs CMD (and everything it starts) under a
 * seccomp filter that makes each named system call (membarrier, rseq) fail with EPERM,
 * as sandboxes that allow-list system calls do. ci/modes.sh runs the test suite under it
 * to check that the library notices the kernel's refusal and takes its fallbacks
 * (SeqCst fences, per-CPU try-locks) on its own, with no setting telling it to.
 */
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

int main(int argc, char **argv)
{
	struct sock_filter f[16];
	int k = 0, i = 1;
	f[k++] = (struct sock_filter)BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr));
	for (; i < argc && strcmp(argv[i], "--") != 0; i++) {
		long nr;
		if (!strcmp(argv[i], "membarrier"))
			nr = SYS_membarrier;
		else if (!strcmp(argv[i], "rseq"))
			nr = SYS_rseq;
		else {
			fprintf(stderr, "seccomp_deny: unknown system call %s\n", argv[i]);
			return 2;
		}
		if (k > 12) {
			fprintf(stderr, "seccomp_deny: too many system calls\n");
			return 2;
		}
		f[k++] = (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (unsigned)nr, 0, 1);
		f[k++] = (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM);
	}
	if (i + 1 >= argc) {
		fprintf(stderr, "usage: seccomp_deny SYSCALL... -- CMD [ARGS]\n");
		return 2;
	}
	f[k++] = (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW);
	struct sock_fprog prog = {.len = (unsigned short)k, .filter = f};
	if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) || prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog)) {
		perror("seccomp_deny: prctl");
		return 2;
	}
	execvp(argv[i + 1], argv + i + 1);
	perror("seccomp_deny: exec");
	return 2;
}
