/* mix.c: every function libscalemem.so exports, from 12 threads at once, checked.
 *
 *   cc -O2 -pthread -o mix preload/tests/mix.c -ldl
 *   MIX_EXPECT=glibc ./mix                                           # glibc's malloc
 *   MIX_EXPECT=scalemem LD_PRELOAD=target/release/libscalemem.so ./mix
 *
 * MIX_EXPECT says whose malloc the run must be using: every exported name is looked up
 * with dlsym(RTLD_DEFAULT) and dladdr names the object that defines it; under
 * "scalemem" all of them must come from libscalemem.so, and the checks that differ
 * from glibc 2.36 (aligned_alloc's EINVAL, mallopt's unknown parameters) are strict.
 *
 * Phases: single-thread corner cases (errno, EINVAL/ENOMEM, overflow, alignment, usable
 * size, mallinfo/mallinfo2/malloc_trim/malloc_stats), then waves of worker threads that
 * mix every allocation and free function on random sizes with content checks, hand
 * blocks to other threads, and exit with blocks still live (freed by the next wave),
 * while the main thread forks children that allocate at once. Exit status 0 if every
 * check passed, 1 otherwise; a deadlock is caught by alarm(). MIX_ITERS scales the run.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <malloc.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

/* mallinfo is deprecated, and exported, so tested; a failed realloc leaves the block
 * live, which GCC's use-after-free analysis does not know. */
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 12
#pragma GCC diagnostic ignored "-Wuse-after-free"
#endif

/* glibc's internal names (exported by glibc and by us; not in any header). */
extern void *__libc_malloc(size_t);
extern void __libc_free(void *);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void *__libc_memalign(size_t, size_t);
extern void *__libc_valloc(size_t);
extern void *__libc_pvalloc(size_t);

/* Not linkable against glibc 2.36 (C23's, or compat-only): found with dlsym; without
 * the preload they fall back to free. */
static void (*p_cfree)(void *);
static void (*p_free_sized)(void *, size_t);
static void (*p_free_aligned_sized)(void *, size_t, size_t);

static atomic_int failures;
static int strict; /* MIX_EXPECT=scalemem */
/* errno, read and written as volatile: GCC assumes the allocation built-ins keep errno
 * and would fold a check of plain errno after a successful call away. */
#define ERRNO (*(volatile int *)&errno)
static long page;

#define CHECK(cond, ...)                                                                       \
    do {                                                                                       \
        if (!(cond)) {                                                                         \
            if (atomic_fetch_add(&failures, 1) < 50) {                                         \
                fprintf(stderr, "mix.c:%d: check failed: %s: ", __LINE__, #cond);              \
                fprintf(stderr, __VA_ARGS__);                                                  \
                fputc('\n', stderr);                                                           \
            }                                                                                  \
        }                                                                                      \
    } while (0)

static uint64_t next_rand(uint64_t *s) {
    uint64_t x = *s;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return *s = x;
}

/* Sizes the compiler cannot see, so that it neither warns about nor folds the calls
 * that must fail. */
static volatile size_t v_size_max = SIZE_MAX, v_ptrdiff_max = PTRDIFF_MAX;

static int aligned(const void *p, size_t a) { return ((uintptr_t)p & (a - 1)) == 0; }

static void fill(void *p, size_t n, unsigned char pat) { memset(p, pat, n); }

static int intact(const void *p, size_t n, unsigned char pat) {
    const unsigned char *c = p;
    for (size_t i = 0; i < n; i++)
        if (c[i] != pat) return 0;
    return 1;
}

/* ---- whose malloc is this? ------------------------------------------------------- */

static const char *const exported[] = {
    "malloc", "free", "calloc", "realloc", "reallocarray", "memalign", "posix_memalign",
    "aligned_alloc", "valloc", "pvalloc", "malloc_usable_size", "cfree", "free_sized",
    "free_aligned_sized", "__libc_malloc", "__libc_free", "__libc_calloc", "__libc_realloc",
    "__libc_memalign", "__libc_valloc", "__libc_pvalloc", "malloc_trim", "mallopt", "mallinfo",
    "mallinfo2", "malloc_stats",
};

static void check_provider(const char *expect) {
    void *self = dlsym(RTLD_DEFAULT, "malloc");
    CHECK(self == (void *)&malloc, "the program's malloc %p is not dlsym's %p", (void *)&malloc, self);
    for (size_t i = 0; i < sizeof exported / sizeof *exported; i++) {
        void *f = dlsym(RTLD_DEFAULT, exported[i]);
        Dl_info info = {0};
        const char *obj = f && dladdr(f, &info) && info.dli_fname ? info.dli_fname : "(none)";
        if (strcmp(expect, "scalemem") == 0) {
            CHECK(strstr(obj, "libscalemem") != NULL, "%s comes from %s", exported[i], obj);
        } else if (strcmp(exported[i], "malloc") == 0) {
            CHECK(strstr(obj, "libc.so") != NULL, "%s comes from %s", exported[i], obj);
        }
    }
}

/* ---- single-thread corner cases ---------------------------------------------------- */

static void corner_cases(void) {
    void *p, *q, *sentinel = (void *)0x1234;

    free(NULL);
    __libc_free(NULL);
    CHECK(malloc_usable_size(NULL) == 0, "malloc_usable_size(NULL) = %zu", malloc_usable_size(NULL));

    /* Success leaves errno alone; free never changes it (POSIX.1-2024). Through ERRNO:
     * with plain errno GCC folds both checks to true (it assumes malloc and free keep
     * errno), so they checked nothing. */
    ERRNO = 4242;
    p = malloc(100), q = malloc((size_t)8 << 20);
    CHECK(p && q && ERRNO == 4242, "malloc changed errno to %d", ERRNO);
    free(p), free(q), free(NULL);
    CHECK(ERRNO == 4242, "free changed errno to %d", ERRNO);

    p = malloc(0), q = malloc(0);
    CHECK(p && q && p != q, "malloc(0) twice: %p %p", p, q);
    free(p), free(q);

    errno = 0;
    CHECK(malloc(v_size_max) == NULL && errno == ENOMEM, "malloc(SIZE_MAX): errno %d", errno);
    errno = 0;
    CHECK(malloc(v_ptrdiff_max) == NULL && errno == ENOMEM, "malloc(PTRDIFF_MAX): errno %d", errno);
    errno = 0;
    CHECK(calloc(v_size_max / 2, 3) == NULL && errno == ENOMEM, "calloc overflow: errno %d", errno);
    errno = 0;
    CHECK(__libc_calloc(3, v_size_max / 2) == NULL && errno == ENOMEM, "__libc_calloc overflow: errno %d", errno);
    p = calloc(0, 8), q = calloc(8, 0);
    CHECK(p && q, "calloc with a zero: %p %p", p, q);
    free(p), free(q);

    /* realloc: NULL is malloc, failure keeps the block, 0 frees. */
    p = realloc(NULL, 100);
    CHECK(p != NULL, "realloc(NULL, 100)");
    fill(p, 100, 0x5a);
    errno = 0;
    CHECK(realloc(p, v_size_max - 4096) == NULL && errno == ENOMEM, "realloc to SIZE_MAX-4096: errno %d", errno);
    errno = 0;
    CHECK(reallocarray(p, v_size_max / 2, 3) == NULL && errno == ENOMEM, "reallocarray overflow: errno %d", errno);
    CHECK(intact(p, 100, 0x5a), "block changed by a failed realloc/reallocarray");
    q = reallocarray(p, 50, 40);
    CHECK(q && intact(q, 100, 0x5a) && malloc_usable_size(q) >= 2000, "reallocarray(p, 50, 40)");
    CHECK(realloc(q, 0) == NULL, "realloc(p, 0) returned non-null");
    p = reallocarray(NULL, 10, 10);
    CHECK(p && malloc_usable_size(p) >= 100, "reallocarray(NULL, 10, 10)");
    free(p);

    /* posix_memalign: EINVAL unless a power-of-two multiple of sizeof(void *). */
    static const size_t bad[] = {0, 1, 2, 4, 12, 24, 40, 48, 96, 4095, 4097, SIZE_MAX};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        p = sentinel;
        int rc = posix_memalign(&p, bad[i], 64);
        CHECK(rc == EINVAL && p == sentinel, "posix_memalign(align %zu) = %d, *memptr %p", bad[i], rc, p);
    }
    p = sentinel;
    int rc = posix_memalign(&p, 64, v_size_max - 4096);
    CHECK(rc == ENOMEM && p == sentinel, "posix_memalign(huge) = %d, *memptr %p", rc, p);
    for (size_t a = sizeof(void *); a <= ((size_t)1 << 22); a <<= 1) {
        p = NULL;
        rc = posix_memalign(&p, a, a * 3 / 2 + 1);
        CHECK(rc == 0 && p && aligned(p, a) && malloc_usable_size(p) >= a * 3 / 2 + 1,
              "posix_memalign(align %zu) = %d, %p", a, rc, p);
        fill(p, a * 3 / 2 + 1, 0x11);
        if (p_free_aligned_sized) p_free_aligned_sized(p, a, a * 3 / 2 + 1);
        else free(p);
    }
    p = NULL;
    CHECK(posix_memalign(&p, 32, 0) == 0, "posix_memalign(32, 0)");
    free(p);
    /* Ours keeps errno through calls that succeed and through posix_memalign, even when
     * the kernel refuses a mapping (glibc may set it). The refusal is made certain in a
     * child whose address space is capped just above what it maps already. errno goes
     * through a volatile lvalue: GCC assumes the allocation built-ins leave errno alone
     * and would fold these checks away. */
    if (strict) {
        ERRNO = 12345;
        p = malloc(100);
        free(p);
        CHECK(ERRNO == 12345, "malloc + free changed errno to %d", ERRNO);
        fflush(NULL);
        pid_t pid = fork();
        if (pid == 0) {
            struct rlimit cap = {0, RLIM_INFINITY};
            FILE *statm = fopen("/proc/self/statm", "r");
            unsigned long pages = 0;
            if (!statm || fscanf(statm, "%lu", &pages) != 1) _exit(3);
            fclose(statm);
            cap.rlim_cur = (pages + 256) * (rlim_t)sysconf(_SC_PAGESIZE);
            if (setrlimit(RLIMIT_AS, &cap) != 0) _exit(3);
            ERRNO = 12345;
            void *q = sentinel;
            int r = posix_memalign(&q, 4096, (size_t)1 << 30);
            if (r != ENOMEM || q != sentinel) _exit(4);
            if (ERRNO != 12345) _exit(5);
            ERRNO = 0;
            if (malloc((size_t)1 << 30) != NULL || ERRNO != ENOMEM) _exit(6);
            _exit(0);
        }
        int status = 0;
        CHECK(pid > 0 && waitpid(pid, &status, 0) == pid, "fork for the errno check");
        CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0,
              "refused mapping: child status %#x (4: posix_memalign result, 5: errno changed, "
              "6: malloc not null/ENOMEM)", status);
    }

    /* memalign rounds a non-power-of-two alignment up; a huge one is EINVAL. */
    static const size_t odd[][2] = {{0, 1}, {1, 1}, {3, 4}, {24, 32}, {48, 64}, {100, 128}, {1000, 1024},
                                    {3000, 4096}, {40000, 65536}};
    for (size_t i = 0; i < sizeof odd / sizeof *odd; i++) {
        p = memalign(odd[i][0], 77);
        CHECK(p && aligned(p, odd[i][1]) && malloc_usable_size(p) >= 77, "memalign(%zu, 77) = %p", odd[i][0], p);
        free(p);
        p = __libc_memalign(odd[i][0], 5000);
        CHECK(p && aligned(p, odd[i][1]) && malloc_usable_size(p) >= 5000, "__libc_memalign(%zu) = %p", odd[i][0], p);
        free(p);
    }
    errno = 0;
    CHECK(memalign(v_size_max / 2 + 2, 16) == NULL && errno == EINVAL, "memalign(huge align): errno %d", errno);
    errno = 0;
    CHECK(memalign(4096, v_size_max - 8192) == NULL && errno == ENOMEM, "memalign(huge size): errno %d", errno);

    /* aligned_alloc: a non-power-of-two alignment is EINVAL (glibc 2.38; 2.36 rounds). */
    for (size_t a = 1; a <= ((size_t)1 << 21); a <<= 1) {
        p = aligned_alloc(a, 3 * a);
        CHECK(p && aligned(p, a) && malloc_usable_size(p) >= 3 * a, "aligned_alloc(%zu) = %p", a, p);
        free(p);
    }
    errno = 0;
    p = aligned_alloc(24, 48);
    if (strict) CHECK(p == NULL && errno == EINVAL, "aligned_alloc(24, 48) = %p, errno %d", p, errno);
    free(p);
    errno = 0;
    p = aligned_alloc(0, 48);
    if (strict) CHECK(p == NULL && errno == EINVAL, "aligned_alloc(0, 48) = %p, errno %d", p, errno);
    free(p);

    /* valloc and pvalloc: page aligned; pvalloc rounds the size up to pages. */
    static const size_t sizes[] = {0, 1, 100, 4095, 4096, 4097, 100000};
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
        /* glibc's pvalloc(0) is not a whole page; ours is. */
        size_t n = sizes[i], pages = n == 0 ? (strict ? (size_t)page : 0) : (n + page - 1) / page * page;
        p = valloc(n);
        CHECK(p && aligned(p, page) && malloc_usable_size(p) >= n, "valloc(%zu) = %p", n, p);
        free(p);
        p = pvalloc(n);
        CHECK(p && aligned(p, page) && malloc_usable_size(p) >= pages, "pvalloc(%zu) = %p, usable %zu", n, p,
              malloc_usable_size(p));
        fill(p, pages, 0x77);
        free(p);
        p = __libc_valloc(n);
        CHECK(p && aligned(p, page), "__libc_valloc(%zu) = %p", n, p);
        free(p);
        p = __libc_pvalloc(n);
        CHECK(p && aligned(p, page) && malloc_usable_size(p) >= pages, "__libc_pvalloc(%zu) = %p", n, p);
        free(p);
    }
    errno = 0;
    CHECK(pvalloc(v_size_max - 10) == NULL && errno == ENOMEM, "pvalloc(v_size_max - 10): errno %d", errno);

    /* The obsolete and C23 frees. */
    p = malloc(10);
    if (p_cfree) p_cfree(p);
    else free(p);
    p = malloc(300);
    if (p_free_sized) p_free_sized(p, 300);
    else free(p);

    /* mallinfo2 sees a large block; malloc_trim and malloc_stats run. */
    size_t big = (size_t)8 << 20;
    p = malloc(big);
    CHECK(p != NULL, "malloc(8 MiB)");
    fill(p, big, 0x42);
    struct mallinfo2 mi2 = mallinfo2();
    /* glibc may serve it from the heap top (its mmap threshold moves), we never do. */
    if (strict) CHECK(mi2.hblkhd >= big, "mallinfo2().hblkhd = %zu with 8 MiB live", mi2.hblkhd);
    CHECK(mi2.arena + mi2.hblkhd >= big, "mallinfo2(): arena %zu + hblkhd %zu", mi2.arena, mi2.hblkhd);
    struct mallinfo mi = mallinfo();
    CHECK(mi.hblkhd > 0 || mi.arena > 0, "mallinfo(): arena %d hblkhd %d", mi.arena, mi.hblkhd);
    free(p);
    /* mallopt accepts glibc's parameters (and we ignore them). */
    CHECK(mallopt(M_ARENA_MAX, 8) == 1, "mallopt(M_ARENA_MAX)");
    CHECK(mallopt(M_MMAP_THRESHOLD, 1 << 20) == 1, "mallopt(M_MMAP_THRESHOLD)");
    CHECK(mallopt(M_TRIM_THRESHOLD, 1 << 20) == 1, "mallopt(M_TRIM_THRESHOLD)");
    if (strict) CHECK(mallopt(12345, 1) == 0, "mallopt(unknown) = %d", mallopt(12345, 1));
    int trimmed = malloc_trim(0);
    CHECK(trimmed == 0 || trimmed == 1, "malloc_trim(0) = %d", trimmed);
    if (getenv("MIX_STATS")) malloc_stats();
}

/* ---- worker threads -------------------------------------------------------------- */

enum kind { PLAIN, ALIGNED };

struct slot {
    void *p;
    size_t size, align;
    unsigned char pat;
    enum kind kind;
};

#define SLOTS 128
#define HANDOFF 256

/* Blocks passed between threads: a worker swaps one in and frees what it swapped out,
 * and blocks left here by exited threads are freed by the next wave. */
static _Atomic(struct slot *) handoff[HANDOFF];

static size_t random_size(uint64_t *r) {
    uint64_t x = next_rand(r);
    switch (x % 64) {
    case 0: return (size_t)(x >> 8) % (4u << 20); /* large: up to 4 MiB */
    case 1: case 2: case 3: return (size_t)(x >> 8) % (256u << 10);
    case 4: case 5: case 6: case 7: case 8: return (size_t)(x >> 8) % 16384;
    default: return (size_t)(x >> 8) % 512;
    }
}

static void release(struct slot *s, uint64_t *r) {
    if (!s->p) return;
    CHECK(intact(s->p, s->size, s->pat), "block %p (%zu bytes) corrupted before free", s->p, s->size);
    switch (next_rand(r) % 6) {
    case 0: __libc_free(s->p); break;
    case 1: if (p_cfree) { p_cfree(s->p); break; } /* fall through */
    case 2: if (p_free_sized) { p_free_sized(s->p, s->size); break; } /* fall through */
    case 3:
        if (p_free_aligned_sized && s->kind == ALIGNED) { p_free_aligned_sized(s->p, s->align, s->size); break; }
        /* fall through */
    default: free(s->p);
    }
    s->p = NULL;
}

static void make(struct slot *s, uint64_t *r) {
    size_t n = random_size(r), a = 16;
    void *p = NULL;
    s->kind = PLAIN;
    switch (next_rand(r) % 12) {
    case 0: p = malloc(n); break;
    case 1: p = __libc_malloc(n); break;
    case 2: {
        size_t k = 1 + next_rand(r) % 16, e = n / k + 1;
        p = next_rand(r) & 1 ? calloc(k, e) : __libc_calloc(k, e);
        n = k * e;
        CHECK(p == NULL || intact(p, n, 0), "calloc(%zu, %zu) not zeroed", k, e);
        break;
    }
    case 3: {
        a = (size_t)1 << (next_rand(r) % 13);
        size_t req = a, expect = a < 16 ? 1 : a;
        if (next_rand(r) & 1 && a > 16) req = a - a / 4, expect = a; /* not a power of two */
        p = next_rand(r) & 1 ? memalign(req, n) : __libc_memalign(req, n);
        a = expect;
        s->kind = ALIGNED;
        break;
    }
    case 4:
        a = sizeof(void *) << (next_rand(r) % 10);
        if (posix_memalign(&p, a, n) != 0) p = NULL;
        s->kind = ALIGNED;
        break;
    case 5:
        a = (size_t)1 << (next_rand(r) % 14);
        p = aligned_alloc(a, n);
        s->kind = ALIGNED;
        break;
    case 6:
        a = page;
        p = next_rand(r) & 1 ? valloc(n) : __libc_valloc(n);
        break;
    case 7:
        a = page;
        p = next_rand(r) & 1 ? pvalloc(n) : __libc_pvalloc(n);
        n = n == 0 ? (strict ? (size_t)page : 0) : (n + page - 1) / page * page;
        break;
    case 8: p = reallocarray(NULL, 1, n); break;
    default: p = realloc(NULL, n); break;
    }
    CHECK(p != NULL, "allocation of %zu bytes (align %zu) failed", n, a);
    if (!p) return;
    CHECK(aligned(p, a < 16 ? 16 : a), "%p not aligned to %zu", p, a);
    CHECK(malloc_usable_size(p) >= n, "usable %zu < requested %zu", malloc_usable_size(p), n);
    s->p = p, s->size = n, s->align = a < 16 ? 16 : a;
    s->pat = (unsigned char)(next_rand(r) | 1);
    fill(p, n, s->pat);
}

/* realloc (or reallocarray) a live block to a new size; the common prefix must survive. */
static void resize(struct slot *s, uint64_t *r) {
    size_t n = random_size(r);
    if (next_rand(r) & 1) n = s->size + (size_t)(next_rand(r) % 1024); /* grow a little */
    void *q;
    switch (next_rand(r) % 3) {
    case 0: q = reallocarray(s->p, n ? n : 1, 1); if (!n) n = 1; break;
    case 1: q = __libc_realloc(s->p, n ? n : 1); if (!n) n = 1; break;
    default: q = realloc(s->p, n ? n : 1); if (!n) n = 1; break;
    }
    CHECK(q != NULL, "realloc(%zu -> %zu) failed", s->size, n);
    if (!q) return;
    size_t keep = s->size < n ? s->size : n;
    CHECK(aligned(q, 16), "realloc result %p not 16-aligned", q);
    CHECK(intact(q, keep, s->pat), "realloc %zu -> %zu lost content", s->size, n);
    CHECK(malloc_usable_size(q) >= n, "realloc: usable %zu < %zu", malloc_usable_size(q), n);
    s->p = q, s->size = n, s->kind = PLAIN, s->align = 16;
    fill(q, n, s->pat);
}

static long iters = 4000;

static void *worker(void *arg) {
    uint64_t r = 0x9e3779b97f4a7c15ull * ((uintptr_t)arg + 1);
    struct slot slots[SLOTS] = {0};
    for (long i = 0; i < iters; i++) {
        struct slot *s = &slots[next_rand(&r) % SLOTS];
        uint64_t op = next_rand(&r) % 16;
        if (op < 7) {
            release(s, &r);
            make(s, &r);
        } else if (op < 11) {
            if (s->p) resize(s, &r);
            else make(s, &r);
        } else if (op < 13) {
            /* Hand a block to another thread; free whatever was there. */
            if (!s->p) continue;
            struct slot *box = malloc(sizeof *box);
            CHECK(box != NULL, "malloc(box)");
            if (!box) continue;
            *box = *s;
            s->p = NULL;
            struct slot *old = atomic_exchange(&handoff[next_rand(&r) % HANDOFF], box);
            if (old) {
                release(old, &r);
                free(old);
            }
        } else if (op == 13) {
            release(s, &r);
        } else if (op == 14 && i % 8 == 0) {
            struct mallinfo2 m = mallinfo2();
            CHECK(m.arena + m.hblkhd > 0, "mallinfo2 in a thread: arena %zu", m.arena);
            (void)mallinfo();
            if (i % 512 == 0) (void)malloc_trim(0);
        }
    }
    /* Exit with half the blocks still live: they go to the handoff table. */
    for (int i = 0; i < SLOTS; i++) {
        if (!slots[i].p) continue;
        if (i % 2) {
            release(&slots[i], &r);
            continue;
        }
        struct slot *box = malloc(sizeof *box);
        if (!box) continue;
        *box = slots[i];
        struct slot *old = atomic_exchange(&handoff[next_rand(&r) % HANDOFF], box);
        if (old) {
            release(old, &r);
            free(old);
        }
    }
    return NULL;
}

/* A forked child allocates at once, while the parent's other threads were allocating at
 * the fork; it also starts a thread of its own. */
static void *child_thread(void *arg) {
    (void)arg;
    for (int i = 0; i < 1000; i++) {
        void *p = malloc((size_t)i * 7 + 1);
        if (!p) return (void *)1;
        memset(p, 1, (size_t)i * 7 + 1);
        free(p);
    }
    return NULL;
}

static int child(unsigned seed) {
    alarm(20);
    atomic_store(&failures, 0);
    uint64_t r = seed * 2654435761u + 1;
    struct slot slots[32] = {0};
    for (int i = 0; i < 2000; i++) {
        struct slot *s = &slots[next_rand(&r) % 32];
        if (s->p && next_rand(&r) % 2) resize(s, &r);
        else {
            release(s, &r);
            make(s, &r);
        }
    }
    for (int i = 0; i < 32; i++) release(&slots[i], &r);
    pthread_t t;
    void *ret = (void *)1;
    if (pthread_create(&t, NULL, child_thread, NULL) == 0) pthread_join(t, &ret);
    CHECK(ret == NULL, "thread in the forked child failed");
    (void)malloc_trim(0);
    return atomic_load(&failures) ? 1 : 0;
}

int main(void) {
    const char *expect = getenv("MIX_EXPECT");
    const char *it = getenv("MIX_ITERS");
    if (!expect || (strcmp(expect, "scalemem") && strcmp(expect, "glibc"))) {
        fprintf(stderr, "set MIX_EXPECT=scalemem (under LD_PRELOAD) or MIX_EXPECT=glibc\n");
        return 2;
    }
    if (it) iters = atol(it);
    strict = strcmp(expect, "scalemem") == 0;
    page = sysconf(_SC_PAGESIZE);
    alarm(300); /* a deadlock fails the run rather than hanging CI */
    p_cfree = (void (*)(void *))dlsym(RTLD_DEFAULT, "cfree");
    p_free_sized = (void (*)(void *, size_t))dlsym(RTLD_DEFAULT, "free_sized");
    p_free_aligned_sized = (void (*)(void *, size_t, size_t))dlsym(RTLD_DEFAULT, "free_aligned_sized");

    check_provider(expect);
    if (strict) CHECK(p_cfree && p_free_sized && p_free_aligned_sized, "a C23/compat free is missing");
    corner_cases();

    enum { WAVES = 4, THREADS = 12, FORKS_PER_WAVE = 6 };
    int forks = 0, child_failures = 0;
    for (int w = 0; w < WAVES; w++) {
        pthread_t t[THREADS];
        for (int i = 0; i < THREADS; i++) {
            int rc = pthread_create(&t[i], NULL, worker, (void *)(uintptr_t)(w * THREADS + i));
            CHECK(rc == 0, "pthread_create: %d", rc);
        }
        /* Fork while the workers allocate. */
        for (int f = 0; f < FORKS_PER_WAVE; f++) {
            usleep(2000);
            pid_t pid = fork();
            if (pid == 0) _exit(child((unsigned)(w * 100 + f)));
            CHECK(pid > 0, "fork failed");
            if (pid < 0) continue;
            int status = 0;
            CHECK(waitpid(pid, &status, 0) == pid, "waitpid");
            forks++;
            if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
                child_failures++;
                CHECK(0, "forked child: %s %d", WIFEXITED(status) ? "exit" : "signal",
                      WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
            }
        }
        for (int i = 0; i < THREADS; i++) pthread_join(t[i], NULL);
    }
    /* The last wave's leftovers. */
    uint64_t r = 42;
    for (int i = 0; i < HANDOFF; i++) {
        struct slot *old = atomic_exchange(&handoff[i], NULL);
        if (old) {
            release(old, &r);
            free(old);
        }
    }
    (void)malloc_trim(0);

    int n = atomic_load(&failures);
    printf("mix: %s: %d waves x %d threads x %ld ops, %d forks (%d failed), %d failed checks\n", expect, WAVES,
           THREADS, iters, forks, child_failures, n);
    return n ? 1 : 0;
}
