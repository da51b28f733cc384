// Large blocks under transparent huge pages (bench/alloc/thp.sh): 48 blocks of 1.5 MiB
// (large heap) interleaved with 48 of 64 KiB that stay live; the large ones are freed,
// then RSS is printed every 15 s while decay and khugepaged run.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
static long rss_kib(void) {
    FILE *f = fopen("/proc/self/status", "r"); char line[256]; long v = -1;
    while (fgets(line, sizeof line, f)) if (!strncmp(line, "VmRSS:", 6)) v = atol(line + 6);
    fclose(f); return v;
}
int main(int argc, char **argv) {
    int secs = argc > 1 ? atoi(argv[1]) : 60;
    enum { N = 48 };
    char *live[N], *big[N];
    for (int i = 0; i < N; i++) {
        live[i] = malloc(64 << 10); memset(live[i], 1, 64 << 10);
        big[i] = malloc(1536 << 10); memset(big[i], 2, 1536 << 10);
    }
    printf("all live: %ld KiB\n", rss_kib());
    for (int i = 0; i < N; i++) free(big[i]);
    printf("after free: %ld KiB\n", rss_kib());
    for (int t = 0; t <= secs; t += 5) {
        void *p = malloc(16); free(p);  // piggy-backed decay
        if (t % 15 == 0) printf("t=%ds: %ld KiB\n", t, rss_kib());
        fflush(stdout);
        sleep(5);
    }
    long sum = 0; for (int i = 0; i < N; i++) sum += live[i][i];
    return sum == N ? 0 : 1;
}
