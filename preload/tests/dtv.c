/*
 * dlopen of many libraries with thread-local storage while other threads allocate: the
 * loader then grows threads' DTVs with malloc/realloc from inside __tls_get_addr, under
 * its TLS lock. An allocator whose own malloc paths reach their thread-local state
 * through __tls_get_addr (the general-dynamic TLS model of a shared library) re-enters
 * the loader there and deadlocks; libscalemem.so uses initial-exec TLS words, which
 * never call it. Exits 0 after every plugin was loaded and touched from a fresh thread
 * and the allocating threads checked every block they freed.
 *
 *   cc -O2 -pthread -o dtv dtv.c -ldl
 *   for i in $(seq 0 63); do cc -O2 -shared -fPIC -DPLUGIN_ID=$i -o plugins/libdtv$i.so dtv_plugin.c; done
 *   LD_PRELOAD=libscalemem.so ./dtv plugins 64
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SLOTS 512
#define ALLOCATORS 4

static atomic_int done;

static void fail(const char *what)
{
	fprintf(stderr, "dtv: %s\n", what);
	exit(1);
}

/* Random malloc/calloc/realloc/free of 1 byte .. 200 KB (size classes and large
 * blocks), each block stamped with its slot's byte and checked before it goes. */
static void *allocator(void *arg)
{
	uint64_t x = 0x9E3779B97F4A7C15ull * (uint64_t)((intptr_t)arg + 1);
	unsigned char *blk[SLOTS] = {0};
	size_t len[SLOTS] = {0};
	long n = 0;
	while (!atomic_load(&done) || n < 1000) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		int i = (int)(x % SLOTS);
		size_t size = 1 + (size_t)((x >> 20) % 200000);
		if (blk[i]) {
			if (blk[i][0] != (unsigned char)i || blk[i][len[i] - 1] != (unsigned char)i)
				fail("a block changed");
		}
		switch ((x >> 40) % 4) {
		case 0:
			free(blk[i]);
			blk[i] = calloc(1, size);
			if (blk[i] && (blk[i][0] || blk[i][size - 1]))
				fail("calloc returned dirty memory");
			break;
		case 1:
			if (blk[i]) {
				unsigned char *p = realloc(blk[i], size);
				if (!p)
					fail("realloc failed");
				blk[i] = p;
				break;
			}
			/* fall through */
		default:
			free(blk[i]);
			blk[i] = malloc(size);
		}
		if (!blk[i])
			fail("out of memory");
		len[i] = size;
		blk[i][0] = blk[i][size - 1] = (unsigned char)i;
		n++;
	}
	for (int i = 0; i < SLOTS; i++)
		free(blk[i]);
	return (void *)n;
}

/* A fresh thread: its TLS blocks (and DTV, sized for every module loaded so far) are
 * made now; its copy of the plugin's counter starts at zero. */
static void *fresh(void *arg)
{
	unsigned long (*touch)(void) = (unsigned long (*)(void))arg;
	void *p = malloc(100);
	if (!p || touch() != 1 || touch() != 2)
		fail("a plugin's thread-local counter is not per thread");
	free(p);
	return NULL;
}

int main(int argc, char **argv)
{
	if (argc != 3)
		fail("usage: dtv PLUGIN_DIR COUNT");
	int count = atoi(argv[2]);
	pthread_t t[ALLOCATORS];
	for (intptr_t i = 0; i < ALLOCATORS; i++)
		if (pthread_create(&t[i], NULL, allocator, (void *)i))
			fail("pthread_create");
	char path[4096];
	unsigned long expect = 0;
	for (int i = 0; i < count; i++) {
		snprintf(path, sizeof path, "%s/libdtv%d.so", argv[1], i);
		void *h = dlopen(path, RTLD_NOW);
		if (!h) {
			fprintf(stderr, "dtv: %s\n", dlerror());
			return 1;
		}
		unsigned long (*touch)(void) = (unsigned long (*)(void))dlsym(h, "plugin_touch");
		if (!touch || touch() != 1)
			fail("plugin_touch");
		pthread_t w;
		if (pthread_create(&w, NULL, fresh, (void *)touch) || pthread_join(w, NULL))
			fail("a fresh thread");
		expect++;
	}
	atomic_store(&done, 1);
	long total = 0;
	for (int i = 0; i < ALLOCATORS; i++) {
		void *r;
		pthread_join(t[i], &r);
		total += (long)r;
	}
	printf("dtv: %lu plugins loaded and touched, %ld allocations checked\n", expect, total);
	return 0;
}
