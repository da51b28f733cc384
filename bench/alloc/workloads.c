/*
 * Field workloads for a C malloc, run under LD_PRELOAD (see ../../../shared/BENCHMARKING.md,
 * "Workloads the allocator must be measured on", and bench/alloc/run.sh).
 *
 *   cc -std=c11 -O2 -pthread -Wall -Wextra -o workloads workloads.c
 *   LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libjemalloc.so.2 ./workloads batch --size 4096 --threads 4
 *
 * Workloads (first argument): whoami, parcheck, batch, prodcons, footprint, vsize, large,
 * largemix, churn, startup (and noop, the process startup spawns). Each prints one line of space-separated key=value pairs starting with
 * "workload=NAME"; configuration keys come first, then the measured values. Rates end in
 * "_per_s"; memory figures are in KiB ("_kib") unless the key says otherwise.
 *
 * Options (all optional; defaults in parentheses, quick-mode defaults in brackets):
 *   --threads T      (batch 1, prodcons 2, footprint 32, vsize 64, large 1, churn 16 = wave)
 *   --size S         batch block size in bytes (4096)
 *   --batch N        batch length (100)
 *   --secs D         timed duration of batch/prodcons/large/parcheck/startup (1.0) [0.05]
 *   --total-mib M    footprint total (256) [16]
 *   --reclaim-secs R footprint wait before the "reclaim" reading (15) [1]
 *   --block-kib K    large block size; largemix: the largest size (2048)
 *   --live L         large: blocks live at once, a ring; largemix: slots (1)
 *   --requests N     largemix: requests in all (20000) [2000]
 *   --nthreads N     churn: threads in all (2000) [64]
 *   --per-thread N   churn: blocks each thread allocates (300)
 *   --stack-kib K    vsize/churn/footprint thread stack size (64)
 *   --quick          quick-mode defaults (also: environment ALLOCBENCH_QUICK=1)
 *
 * Nothing here asserts a timing; the program measures and prints.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define PAGE 4096
#define CACHELINE 64

/* ---------------------------------------------------------------- options */

static struct {
	int threads;       /* 0 = workload default */
	size_t size;
	int batch;
	double secs;
	size_t total_mib;
	double reclaim_secs;
	size_t block_kib;
	int live;
	int nthreads;
	int per_thread;
	int requests;
	size_t stack_kib;
	int quick;
} opt = {
	.threads = 0,
	.size = 4096,
	.batch = 100,
	.secs = -1,
	.total_mib = 0,
	.reclaim_secs = -1,
	.block_kib = 2048,
	.live = 1,
	.nthreads = 0,
	.per_thread = 300,
	.requests = 0,
	.stack_kib = 64,
	.quick = 0,
};

static void die(const char *what)
{
	fprintf(stderr, "workloads: %s\n", what);
	exit(2);
}

static void die_errno(const char *what, int err)
{
	fprintf(stderr, "workloads: %s: %s\n", what, strerror(err));
	exit(2);
}

static void *xmalloc(size_t n)
{
	void *p = malloc(n);
	if (!p)
		die("malloc returned NULL");
	return p;
}

/* ---------------------------------------------------------------- clocks, rusage, /proc */

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void sleep_secs(double s)
{
	struct timespec ts;
	ts.tv_sec = (time_t)s;
	ts.tv_nsec = (long)((s - (double)ts.tv_sec) * 1e9);
	while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
	}
}

static long minflt(void)
{
	struct rusage ru;
	getrusage(RUSAGE_SELF, &ru);
	return ru.ru_minflt;
}

/* A "VmXXX:   1234 kB" field of /proc/self/status, in KiB (-1 if absent). Uses stdio
 * on a static buffer: the FILE itself is malloc'd by glibc, which is the allocator
 * under test; that is one small allocation, the same for every allocator. */
static long proc_status_kib(const char *field)
{
	static char line[256];
	size_t flen = strlen(field);
	long v = -1;
	FILE *f = fopen("/proc/self/status", "r");
	if (!f)
		return -1;
	while (fgets(line, sizeof line, f)) {
		if (strncmp(line, field, flen) == 0 && line[flen] == ':') {
			v = strtol(line + flen + 1, NULL, 10);
			break;
		}
	}
	fclose(f);
	return v;
}

/* ---------------------------------------------------------------- threads */

typedef struct {
	pthread_mutex_t m;
	pthread_cond_t c;
	unsigned n, arrived, gen;
} barrier_t;

static void barrier_init(barrier_t *b, unsigned n)
{
	pthread_mutex_init(&b->m, NULL);
	pthread_cond_init(&b->c, NULL);
	b->n = n;
	b->arrived = 0;
	b->gen = 0;
}

static void barrier_wait(barrier_t *b)
{
	pthread_mutex_lock(&b->m);
	unsigned gen = b->gen;
	if (++b->arrived == b->n) {
		b->arrived = 0;
		b->gen++;
		pthread_cond_broadcast(&b->c);
	} else {
		while (gen == b->gen)
			pthread_cond_wait(&b->c, &b->m);
	}
	pthread_mutex_unlock(&b->m);
}

static pthread_t spawn(void *(*fn)(void *), void *arg, size_t stack_bytes)
{
	pthread_attr_t attr;
	pthread_t t;
	pthread_attr_init(&attr);
	if (stack_bytes) {
		int e = pthread_attr_setstacksize(&attr, stack_bytes);
		if (e)
			die_errno("pthread_attr_setstacksize", e);
		e = pthread_attr_setguardsize(&attr, PAGE);
		if (e)
			die_errno("pthread_attr_setguardsize", e);
	}
	int e = pthread_create(&t, &attr, fn, arg);
	if (e)
		die_errno("pthread_create", e);
	pthread_attr_destroy(&attr);
	return t;
}

static atomic_int stop_flag;
static barrier_t start_barrier;

/* Per-thread counters on their own cache lines. */
typedef struct {
	_Alignas(CACHELINE) unsigned long count;
	unsigned long aux;
	int id;
} slot_t; /* the alignment rounds the size up to a whole line */

static uint64_t xorshift(uint64_t *s)
{
	uint64_t x = *s;
	x ^= x << 13;
	x ^= x >> 7;
	x ^= x << 17;
	return *s = x;
}

/* Mixed sizes 16..4096: a power-of-two class 16..4096 chosen uniformly, then a size
 * uniform in (class/2, class], at least 16. Small and large requests equally often. */
static size_t mixed_size(uint64_t *rng)
{
	uint64_t r = xorshift(rng);
	size_t cls = (size_t)16 << (r % 9);
	size_t lo = cls / 2;
	size_t s = lo + 1 + (size_t)((r >> 8) % (cls - lo));
	return s < 16 ? 16 : s;
}

/* Write one byte per 4 KiB page and the first and last byte. */
static void touch(void *p, size_t n)
{
	volatile unsigned char *b = p;
	for (size_t off = 0; off < n; off += PAGE)
		b[off] = (unsigned char)off;
	b[0] = 1;
	b[n - 1] = 1;
}

/* ---------------------------------------------------------------- whoami */

/* Which mapped file provides malloc: &malloc, taken in this executable, resolves
 * through the GOT to the definition that won symbol interposition. */
static int run_whoami(void)
{
	void *(*volatile m)(size_t) = malloc;
	uintptr_t a = (uintptr_t)m;
	static char line[1024];
	char found[1024] = "unknown";
	FILE *f = fopen("/proc/self/maps", "r");
	if (!f)
		die("cannot open /proc/self/maps");
	while (fgets(line, sizeof line, f)) {
		unsigned long lo, hi;
		int off = 0;
		if (sscanf(line, "%lx-%lx %*s %*s %*s %*s %n", &lo, &hi, &off) < 2)
			continue;
		if (a >= lo && a < hi && off > 0) {
			char *path = line + off;
			path[strcspn(path, "\n")] = 0;
			snprintf(found, sizeof found, "%s", *path ? path : "anonymous");
			break;
		}
	}
	fclose(f);
	printf("workload=whoami malloc_from=%s\n", found);
	return 0;
}

/* ---------------------------------------------------------------- parcheck */

static void *spin_thread(void *arg)
{
	slot_t *s = arg;
	unsigned long n = 0;
	barrier_wait(&start_barrier);
	while (!atomic_load_explicit(&stop_flag, memory_order_relaxed)) {
		for (int i = 0; i < 100000; i++) {
			n++;
			__asm__ volatile("" : "+r"(n));
		}
	}
	s->count = n;
	return NULL;
}

static double spin_rate(int threads, double secs)
{
	slot_t *slots = aligned_alloc(CACHELINE, sizeof(slot_t) * (size_t)threads);
	pthread_t *t = xmalloc(sizeof(pthread_t) * (size_t)threads);
	if (!slots)
		die("aligned_alloc");
	atomic_store(&stop_flag, 0);
	barrier_init(&start_barrier, (unsigned)threads + 1);
	for (int i = 0; i < threads; i++)
		t[i] = spawn(spin_thread, &slots[i], 0);
	barrier_wait(&start_barrier);
	double t0 = now();
	sleep_secs(secs);
	atomic_store(&stop_flag, 1);
	unsigned long total = 0;
	for (int i = 0; i < threads; i++) {
		pthread_join(t[i], NULL);
		total += slots[i].count;
	}
	double el = now() - t0;
	free(t);
	free(slots);
	return (double)total / el;
}

static int run_parcheck(void)
{
	double secs = opt.secs;
	double r1 = spin_rate(1, secs);
	double r2 = spin_rate(2, secs);
	double r1b = spin_rate(1, secs);
	double one = r1 > r1b ? r1 : r1b;
	printf("workload=parcheck secs=%.3f one_thread_per_s=%.4g two_threads_per_s=%.4g speedup=%.3f\n",
	       secs, one, r2, r2 / one);
	return 0;
}

/* ---------------------------------------------------------------- batch */

static void batch_loop(void **blk)
{
	for (int i = 0; i < opt.batch; i++) {
		blk[i] = xmalloc(opt.size);
		touch(blk[i], opt.size);
	}
	for (int i = 0; i < opt.batch; i++)
		free(blk[i]);
}

static void *batch_thread(void *arg)
{
	slot_t *s = arg;
	void **blk = xmalloc(sizeof(void *) * (size_t)opt.batch);
	for (int w = 0; w < 3; w++) /* warm-up, outside the timed window */
		batch_loop(blk);
	barrier_wait(&start_barrier);
	unsigned long loops = 0;
	while (!atomic_load_explicit(&stop_flag, memory_order_relaxed)) {
		batch_loop(blk);
		loops++;
	}
	s->count = loops;
	free(blk);
	return NULL;
}

static int run_batch(void)
{
	int T = opt.threads ? opt.threads : 1;
	slot_t *slots = aligned_alloc(CACHELINE, sizeof(slot_t) * (size_t)T);
	pthread_t *t = xmalloc(sizeof(pthread_t) * (size_t)T);
	if (!slots)
		die("aligned_alloc");
	barrier_init(&start_barrier, (unsigned)T + 1);
	for (int i = 0; i < T; i++)
		t[i] = spawn(batch_thread, &slots[i], 0);
	barrier_wait(&start_barrier);
	long f0 = minflt();
	double t0 = now();
	sleep_secs(opt.secs);
	atomic_store(&stop_flag, 1);
	unsigned long loops = 0, lo = (unsigned long)-1, hi = 0;
	for (int i = 0; i < T; i++) {
		pthread_join(t[i], NULL);
		loops += slots[i].count;
		if (slots[i].count < lo)
			lo = slots[i].count;
		if (slots[i].count > hi)
			hi = slots[i].count;
	}
	double el = now() - t0;
	long f1 = minflt();
	double allocs = (double)loops * opt.batch;
	printf("workload=batch size=%zu threads=%d batch=%d secs=%.3f loops_per_s=%.4g "
	       "loops_per_s_per_thread=%.4g allocs_per_s=%.4g faults_per_alloc=%.4f "
	       "slowest_thread_share=%.3f\n",
	       opt.size, T, opt.batch, el, loops / el, loops / el / T, allocs / el,
	       allocs > 0 ? (double)(f1 - f0) / allocs : 0.0,
	       loops ? (double)lo * T / (double)loops : 0.0);
	(void)hi;
	free(t);
	free(slots);
	return 0;
}

/* ---------------------------------------------------------------- prodcons */

#define RING 1024 /* power of two */

typedef struct {
	_Alignas(CACHELINE) atomic_size_t head; /* written by the producer */
	_Alignas(CACHELINE) atomic_size_t tail; /* written by the consumer */
	_Alignas(CACHELINE) void *slot[RING];
	unsigned long produced, consumed;
	atomic_int producer_done;
} ring_t;

static void backoff(unsigned *spins)
{
	if (++*spins < 64)
		__asm__ volatile("pause" ::: "memory");
	else {
		*spins = 0;
		sched_yield();
	}
}

static void *producer(void *arg)
{
	ring_t *r = arg;
	uint64_t rng = 0x9E3779B97F4A7C15ull ^ (uint64_t)(uintptr_t)r;
	size_t head = 0;
	unsigned long n = 0;
	barrier_wait(&start_barrier);
	while (!atomic_load_explicit(&stop_flag, memory_order_relaxed)) {
		size_t sz = mixed_size(&rng);
		unsigned char *p = xmalloc(sz);
		p[0] = (unsigned char)sz;
		p[sz - 1] = 1;
		unsigned spins = 0;
		while (head - atomic_load_explicit(&r->tail, memory_order_acquire) == RING) {
			if (atomic_load_explicit(&stop_flag, memory_order_relaxed)) {
				free(p); /* a local free after the window; not counted */
				goto out;
			}
			backoff(&spins);
		}
		r->slot[head % RING] = p;
		atomic_store_explicit(&r->head, ++head, memory_order_release);
		n++;
	}
out:
	r->produced = n;
	atomic_store_explicit(&r->producer_done, 1, memory_order_release);
	return NULL;
}

static void *consumer(void *arg)
{
	ring_t *r = arg;
	size_t tail = 0;
	unsigned long n = 0;
	volatile unsigned char sink = 0;
	barrier_wait(&start_barrier);
	for (;;) {
		unsigned spins = 0;
		size_t head;
		while ((head = atomic_load_explicit(&r->head, memory_order_acquire)) == tail) {
			if (atomic_load_explicit(&r->producer_done, memory_order_acquire) &&
			    atomic_load_explicit(&r->head, memory_order_acquire) == tail)
				goto out;
			backoff(&spins);
		}
		int counting = !atomic_load_explicit(&stop_flag, memory_order_relaxed);
		for (; tail != head; tail++) {
			unsigned char *p = r->slot[tail % RING];
			sink ^= p[0]; /* read the block, as a consumer would */
			free(p);
			n += (unsigned long)counting;
		}
		atomic_store_explicit(&r->tail, tail, memory_order_release);
	}
out:
	r->consumed = n;
	return NULL;
}

static int run_prodcons(void)
{
	int T = opt.threads ? opt.threads : 2;
	if (T < 2 || T % 2)
		die("prodcons needs an even --threads >= 2");
	int P = T / 2;
	ring_t *rings = aligned_alloc(CACHELINE, sizeof(ring_t) * (size_t)P);
	pthread_t *t = xmalloc(sizeof(pthread_t) * (size_t)T);
	if (!rings)
		die("aligned_alloc");
	memset(rings, 0, sizeof(ring_t) * (size_t)P);
	barrier_init(&start_barrier, (unsigned)T + 1);
	for (int i = 0; i < P; i++) {
		t[2 * i] = spawn(producer, &rings[i], 0);
		t[2 * i + 1] = spawn(consumer, &rings[i], 0);
	}
	barrier_wait(&start_barrier);
	long f0 = minflt();
	double t0 = now();
	sleep_secs(opt.secs);
	atomic_store(&stop_flag, 1);
	double el = now() - t0; /* frees counted are those a consumer began before the stop */
	for (int i = 0; i < T; i++)
		pthread_join(t[i], NULL);
	long f1 = minflt();
	unsigned long frees = 0, produced = 0;
	for (int i = 0; i < P; i++) {
		frees += rings[i].consumed;
		produced += rings[i].produced;
	}
	printf("workload=prodcons threads=%d pairs=%d secs=%.3f frees_per_s=%.4g "
	       "frees_per_s_per_pair=%.4g faults_per_alloc=%.4f\n",
	       T, P, el, frees / el, frees / el / P,
	       produced ? (double)(f1 - f0) / (double)produced : 0.0);
	free(t);
	free(rings);
	return 0;
}

/* ---------------------------------------------------------------- footprint */

static barrier_t fp_measured, fp_freed, fp_exit;

typedef struct {
	size_t nblocks;
} fp_arg_t;

static void *footprint_thread(void *arg)
{
	fp_arg_t *a = arg;
	void **blk = xmalloc(sizeof(void *) * a->nblocks);
	for (size_t i = 0; i < a->nblocks; i++) {
		blk[i] = xmalloc(PAGE);
		memset(blk[i], (int)(i | 1), PAGE);
	}
	barrier_wait(&start_barrier); /* everything live: the peak */
	barrier_wait(&fp_measured);   /* until the main thread has read VmRSS */
	for (size_t i = 0; i < a->nblocks; i++)
		free(blk[i]);
	free(blk);
	barrier_wait(&fp_freed);
	barrier_wait(&fp_exit); /* park until the main thread has measured */
	return NULL;
}

static int run_footprint(void)
{
	int T = opt.threads ? opt.threads : 32;
	size_t total = opt.total_mib << 20;
	fp_arg_t a = {.nblocks = total / PAGE / (size_t)T};
	pthread_t *t = xmalloc(sizeof(pthread_t) * (size_t)T);
	long rss0 = proc_status_kib("VmRSS");
	barrier_init(&start_barrier, (unsigned)T + 1);
	barrier_init(&fp_measured, (unsigned)T + 1);
	barrier_init(&fp_freed, (unsigned)T + 1);
	barrier_init(&fp_exit, (unsigned)T + 1);
	for (int i = 0; i < T; i++)
		t[i] = spawn(footprint_thread, &a, opt.stack_kib << 10);
	barrier_wait(&start_barrier);
	long rss_live = proc_status_kib("VmRSS");
	barrier_wait(&fp_measured);
	barrier_wait(&fp_freed);
	long rss_freed = proc_status_kib("VmRSS");
	sleep_secs(opt.reclaim_secs);
	free(xmalloc(16)); /* a small malloc/free from the main thread, then measure */
	long rss_reclaim = proc_status_kib("VmRSS");
	barrier_wait(&fp_exit);
	for (int i = 0; i < T; i++)
		pthread_join(t[i], NULL);
	long rss_exit = proc_status_kib("VmRSS");
	long hwm = proc_status_kib("VmHWM");
	printf("workload=footprint threads=%d total_mib=%zu reclaim_s=%g poke=malloc16_free_after_wait "
	       "rss_start_kib=%ld peak_rss_kib=%ld rss_all_live_kib=%ld rss_after_free_kib=%ld "
	       "rss_after_reclaim_wait_kib=%ld rss_after_exit_kib=%ld\n",
	       T, opt.total_mib, opt.reclaim_secs, rss0, hwm, rss_live, rss_freed, rss_reclaim,
	       rss_exit);
	free(t);
	return 0;
}

/* ---------------------------------------------------------------- vsize */

static barrier_t vs_parked, vs_exit;

static void *vsize_thread(void *arg)
{
	(void)arg;
	void *p = xmalloc(1024);
	memset(p, 1, 1024);
	barrier_wait(&vs_parked);
	barrier_wait(&vs_exit);
	free(p);
	return NULL;
}

static int run_vsize(void)
{
	int T = opt.threads ? opt.threads : 64;
	size_t stack = opt.stack_kib << 10;
	pthread_t *t = xmalloc(sizeof(pthread_t) * (size_t)T);
	barrier_init(&vs_parked, (unsigned)T + 1);
	barrier_init(&vs_exit, (unsigned)T + 1);
	free(xmalloc(1024)); /* the main thread's own first allocation, outside the delta */
	long vm0 = proc_status_kib("VmSize");
	long rss0 = proc_status_kib("VmRSS");
	for (int i = 0; i < T; i++)
		t[i] = spawn(vsize_thread, NULL, stack);
	barrier_wait(&vs_parked);
	long vm1 = proc_status_kib("VmSize");
	long rss1 = proc_status_kib("VmRSS");
	barrier_wait(&vs_exit);
	for (int i = 0; i < T; i++)
		pthread_join(t[i], NULL);
	double per = (double)(vm1 - vm0) / T;
	/* glibc maps stack + guard per thread (the guard is added to the requested size) */
	double stack_kib = (double)(stack + PAGE) / 1024.0;
	printf("workload=vsize threads=%d stack_kib=%zu vmsize_start_kib=%ld vmsize_growth_kib=%ld "
	       "vmsize_per_thread_kib=%.1f vmsize_per_thread_minus_stack_kib=%.1f "
	       "rss_per_thread_kib=%.1f\n",
	       T, opt.stack_kib, vm0, vm1 - vm0, per, per - stack_kib, (double)(rss1 - rss0) / T);
	free(t);
	return 0;
}

/* ---------------------------------------------------------------- large */

static void write5(unsigned char *p, size_t n)
{
	size_t pages = n / PAGE;
	for (int k = 0; k < 5; k++) {
		size_t pg = pages > 1 ? (size_t)k * (pages - 1) / 4 : 0;
		((volatile unsigned char *)p)[pg * PAGE] = (unsigned char)(k + 1);
	}
}

static int run_large(void)
{
	size_t n = opt.block_kib << 10;
	int L = opt.live;
	if (L < 1)
		die("--live must be >= 1");
	unsigned char **ring = xmalloc(sizeof(void *) * (size_t)L);
	for (int i = 0; i < L; i++) { /* warm-up: fill the ring */
		ring[i] = xmalloc(n);
		write5(ring[i], n);
	}
	unsigned long req = 0;
	long f0 = minflt();
	double t0 = now(), el;
	for (;;) {
		for (int k = 0; k < 64; k++) {
			int i = (int)(req % (unsigned long)L);
			free(ring[i]);
			ring[i] = xmalloc(n);
			write5(ring[i], n);
			req++;
		}
		el = now() - t0;
		if (el >= opt.secs)
			break;
	}
	long f1 = minflt();
	for (int i = 0; i < L; i++)
		free(ring[i]);
	free(ring);
	printf("workload=large block_kib=%zu live=%d secs=%.3f requests_per_s=%.4g faults_per_request=%.3f\n",
	       opt.block_kib, L, el, req / el, (double)(f1 - f0) / (double)req);
	return 0;
}

/* ---------------------------------------------------------------- largemix */

/*
 * Large blocks of mixed sizes: L slots, each request frees a random slot's block and
 * puts in its place a block of a random size from 256 KiB to --block-kib, every page
 * written (run.sh: 4 and 16 slots, up to 4 MiB). What it measures is how well freed large memory
 * is reused for other sizes: the peak RSS against what is live (at most L blocks), and
 * the minor faults per request (a reused resident block takes none; fresh memory takes
 * one per page).
 */
static int run_largemix(void)
{
	int L = opt.live;
	size_t lo = 256 << 10, hi = opt.block_kib << 10;
	if (L < 1 || hi <= lo)
		die("largemix: --live must be >= 1 and --block-kib above 256");
	unsigned char **slot = calloc((size_t)L, sizeof(void *));
	if (!slot)
		die("calloc");
	uint64_t rng = 0x9E3779B97F4A7C15ull;
	long f0 = minflt();
	double t0 = now();
	for (int r = 0; r < opt.requests; r++) {
		uint64_t x = xorshift(&rng);
		int k = (int)(x % (uint64_t)L);
		free(slot[k]);
		size_t n = lo + (size_t)((x >> 20) % (hi - lo));
		unsigned char *p = xmalloc(n);
		for (size_t o = 0; o < n; o += PAGE)
			((volatile unsigned char *)p)[o] = 1;
		slot[k] = p;
	}
	double el = now() - t0;
	long f1 = minflt();
	struct rusage ru;
	getrusage(RUSAGE_SELF, &ru);
	for (int i = 0; i < L; i++)
		free(slot[i]);
	free(slot);
	printf("workload=largemix live=%d max_kib=%zu requests=%d secs=%.3f requests_per_s=%.4g "
	       "faults_per_request=%.3f peak_rss_kib=%ld\n",
	       L, opt.block_kib, opt.requests, el, opt.requests / el, (double)(f1 - f0) / opt.requests,
	       ru.ru_maxrss);
	return 0;
}

/* ---------------------------------------------------------------- churn */

static void *churn_thread(void *arg)
{
	slot_t *s = arg;
	uint64_t rng = 0x2545F4914F6CDD1Dull * (uint64_t)(s->id + 1);
	int n = opt.per_thread;
	void **blk = xmalloc(sizeof(void *) * (size_t)n);
	for (int i = 0; i < n; i++) {
		size_t sz = mixed_size(&rng);
		blk[i] = xmalloc(sz);
		((unsigned char *)blk[i])[0] = 1;
		((unsigned char *)blk[i])[sz - 1] = 1;
		if (i % 3 == 2) { /* free some early: interleaved, not only LIFO */
			int j = (int)(xorshift(&rng) % (uint64_t)(i + 1));
			free(blk[j]);
			blk[j] = blk[i];
			blk[i] = NULL;
		}
	}
	for (int i = 0; i < n; i++)
		free(blk[i]);
	free(blk);
	return NULL;
}

static int run_churn(void)
{
	int W = opt.threads ? opt.threads : 16;
	int N = opt.nthreads;
	slot_t *slots = aligned_alloc(CACHELINE, sizeof(slot_t) * (size_t)W);
	pthread_t *t = xmalloc(sizeof(pthread_t) * (size_t)W);
	if (!slots)
		die("aligned_alloc");
	long rss0 = proc_status_kib("VmRSS");
	long rss1 = 0, vm1 = 0;
	double t0 = now();
	int done = 0, wave = 0;
	while (done < N) {
		int w = N - done < W ? N - done : W;
		for (int i = 0; i < w; i++) {
			slots[i].id = done + i;
			t[i] = spawn(churn_thread, &slots[i], opt.stack_kib << 10);
		}
		for (int i = 0; i < w; i++)
			pthread_join(t[i], NULL);
		done += w;
		if (wave++ == 0) {
			rss1 = proc_status_kib("VmRSS");
			vm1 = proc_status_kib("VmSize");
		}
	}
	double el = now() - t0;
	long rss2 = proc_status_kib("VmRSS");
	long vm2 = proc_status_kib("VmSize");
	printf("workload=churn nthreads=%d wave=%d per_thread=%d secs=%.3f threads_per_s=%.4g "
	       "rss_start_kib=%ld rss_after_first_wave_kib=%ld rss_end_kib=%ld "
	       "rss_growth_after_first_wave_kib=%ld vmsize_growth_after_first_wave_kib=%ld\n",
	       N, W, opt.per_thread, el, N / el, rss0, rss1, rss2, rss2 - rss1, vm2 - vm1);
	free(t);
	free(slots);
	return 0;
}

/* ---------------------------------------------------------------- startup */

extern char **environ;

/* What a short-lived process costs under the allocator: spawns this program as
 * `workloads noop` (one malloc and free, then exit) one after another for --secs, with the
 * environment (so LD_PRELOAD) inherited, and waits for each. The figure is the whole life
 * of a process: exec, the loader mapping the library, its constructors (a thread it
 * starts), the first allocation's set-up, exit. */
static int run_startup(void)
{
	char exe[4096];
	ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
	if (n <= 0)
		die_errno("readlink /proc/self/exe", errno);
	exe[n] = 0;
	char *argv[] = { exe, "noop", NULL };
	long runs = 0;
	double t0 = now(), el;
	do {
		pid_t pid;
		int err = posix_spawn(&pid, exe, NULL, NULL, argv, environ);
		if (err)
			die_errno("posix_spawn", err);
		int status;
		if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
			die("the spawned noop failed");
		runs++;
		el = now() - t0;
	} while (el < opt.secs);
	struct rusage ru;
	getrusage(RUSAGE_CHILDREN, &ru);
	printf("workload=startup secs=%.3f processes=%ld processes_per_s=%.4g us_per_process=%.1f "
	       "child_max_rss_kib=%ld\n",
	       el, runs, runs / el, el / runs * 1e6, ru.ru_maxrss);
	return 0;
}

static int run_noop(void)
{
	volatile char *p = malloc(100);
	if (!p)
		return 1;
	p[0] = 1;
	free((void *)p);
	return 0;
}

/* ---------------------------------------------------------------- main */

static void usage(void)
{
	fprintf(stderr,
		"usage: workloads {whoami|parcheck|batch|prodcons|footprint|vsize|large|largemix|churn|startup|noop} [options]\n"
		"  see the comment at the top of workloads.c for the options\n");
	exit(2);
}

static const char *need(int argc, char **argv, int *i)
{
	if (*i + 1 >= argc)
		usage();
	return argv[++*i];
}

int main(int argc, char **argv)
{
	if (argc < 2)
		usage();
	const char *w = argv[1];
	const char *q = getenv("ALLOCBENCH_QUICK");
	if (q && *q && strcmp(q, "0") != 0)
		opt.quick = 1;
	for (int i = 2; i < argc; i++) {
		const char *a = argv[i];
		if (!strcmp(a, "--threads"))
			opt.threads = atoi(need(argc, argv, &i));
		else if (!strcmp(a, "--size"))
			opt.size = (size_t)strtoull(need(argc, argv, &i), NULL, 10);
		else if (!strcmp(a, "--batch"))
			opt.batch = atoi(need(argc, argv, &i));
		else if (!strcmp(a, "--secs"))
			opt.secs = atof(need(argc, argv, &i));
		else if (!strcmp(a, "--total-mib"))
			opt.total_mib = (size_t)strtoull(need(argc, argv, &i), NULL, 10);
		else if (!strcmp(a, "--reclaim-secs"))
			opt.reclaim_secs = atof(need(argc, argv, &i));
		else if (!strcmp(a, "--block-kib"))
			opt.block_kib = (size_t)strtoull(need(argc, argv, &i), NULL, 10);
		else if (!strcmp(a, "--live"))
			opt.live = atoi(need(argc, argv, &i));
		else if (!strcmp(a, "--nthreads"))
			opt.nthreads = atoi(need(argc, argv, &i));
		else if (!strcmp(a, "--requests"))
			opt.requests = atoi(need(argc, argv, &i));
		else if (!strcmp(a, "--per-thread"))
			opt.per_thread = atoi(need(argc, argv, &i));
		else if (!strcmp(a, "--stack-kib"))
			opt.stack_kib = (size_t)strtoull(need(argc, argv, &i), NULL, 10);
		else if (!strcmp(a, "--quick"))
			opt.quick = 1;
		else
			usage();
	}
	if (opt.secs < 0)
		opt.secs = opt.quick ? 0.05 : 1.0;
	if (opt.total_mib == 0)
		opt.total_mib = opt.quick ? 16 : 256;
	if (opt.reclaim_secs < 0)
		opt.reclaim_secs = opt.quick ? 1 : 15;
	if (opt.nthreads == 0)
		opt.nthreads = opt.quick ? 64 : 2000;
	if (opt.requests == 0)
		opt.requests = opt.quick ? 2000 : 20000;
	if (opt.size == 0 || opt.batch < 1 || opt.per_thread < 1 || opt.threads < 0 ||
	    opt.block_kib == 0 || opt.stack_kib < 16 || opt.nthreads < 1 || opt.requests < 1)
		die("bad option value");

	if (!strcmp(w, "whoami"))
		return run_whoami();
	if (!strcmp(w, "parcheck"))
		return run_parcheck();
	if (!strcmp(w, "batch"))
		return run_batch();
	if (!strcmp(w, "prodcons"))
		return run_prodcons();
	if (!strcmp(w, "footprint"))
		return run_footprint();
	if (!strcmp(w, "vsize"))
		return run_vsize();
	if (!strcmp(w, "large"))
		return run_large();
	if (!strcmp(w, "largemix"))
		return run_largemix();
	if (!strcmp(w, "churn"))
		return run_churn();
	if (!strcmp(w, "startup"))
		return run_startup();
	if (!strcmp(w, "noop"))
		return run_noop();
	usage();
	return 2;
}
