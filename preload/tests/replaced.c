/* A tool that replaces the malloc family by symbol must see every block the program
 * makes through libscalemem.so's exports.
 *
 *   cc -O2 -Wall -o replaced preload/tests/replaced.c -ldl
 *   LD_PRELOAD=target/release/libscalemem.so valgrind -q --leak-check=full --show-leak-kinds=definite \
 *       --errors-for-leak-kinds=definite --error-exitcode=99 ./replaced
 *
 * valgrind's memcheck replaces `malloc`, `free`, `realloc`, `memalign` and friends in
 * every object (libscalemem.so included) but has no replacement for `reallocarray`,
 * `pvalloc`, `free_sized`, `free_aligned_sized` or glibc's `__libc_*` names: each of those
 * must reach the block through one of the replaced names, as glibc's own do. Otherwise a
 * block made by our `reallocarray` is freed by memcheck's `free` ("Invalid free"), or
 * a memcheck block freed by our `free_sized` is never freed ("definitely lost").
 * Every block here is made by one name and freed by another. Exit status 0, and memcheck
 * must report no error. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void *__libc_memalign(size_t, size_t);
extern void *__libc_valloc(size_t);
extern void *__libc_pvalloc(size_t);
extern void __libc_free(void *);

static int failures;

#define CHECK(cond, what)                                         \
    do {                                                          \
        if (!(cond)) {                                            \
            fprintf(stderr, "replaced.c: check failed: %s\n", what); \
            failures++;                                           \
        }                                                         \
    } while (0)

/* Writes and reads back every byte, so memcheck sees any access outside a block it
 * knows. */
static void use(void *p, size_t n) {
    CHECK(p != NULL, "allocation failed");
    if (!p) return;
    memset(p, 0x5a, n);
    unsigned char *b = p;
    for (size_t i = 0; i < n; i++) CHECK(b[i] == 0x5a, "block lost its bytes");
}

int main(void) {
    /* The C23 frees are optional in glibc 2.36's headers: look them up. */
    void (*free_sized_f)(void *, size_t) = (void (*)(void *, size_t))dlsym(RTLD_DEFAULT, "free_sized");
    void (*free_aligned_sized_f)(void *, size_t, size_t) =
        (void (*)(void *, size_t, size_t))dlsym(RTLD_DEFAULT, "free_aligned_sized");
    void (*cfree_f)(void *) = (void (*)(void *))dlsym(RTLD_DEFAULT, "cfree");

    void *p = reallocarray(NULL, 10, 10); /* made by reallocarray, freed by free */
    use(p, 100);
    p = reallocarray(p, 20, 10); /* grown by reallocarray */
    use(p, 200);
    free(p);

    p = malloc(64); /* made by malloc, grown by reallocarray, freed by free */
    use(p, 64);
    p = reallocarray(p, 100, 8);
    use(p, 800);
    free(p);

    p = pvalloc(100);
    use(p, 100);
    free(p);

    p = __libc_memalign(64, 100);
    use(p, 100);
    CHECK(((size_t)p & 63) == 0, "__libc_memalign(64) misaligned");
    free(p);

    p = __libc_pvalloc(100);
    use(p, 100);
    free(p);

    p = __libc_valloc(100);
    use(p, 100);
    free(p);

    p = __libc_malloc(100);
    use(p, 100);
    p = __libc_realloc(p, 300);
    use(p, 300);
    free(p);

    p = __libc_calloc(10, 10);
    use(p, 100);
    free(p);

    p = malloc(100); /* made by malloc, freed by each of the other frees */
    use(p, 100);
    __libc_free(p);
    if (free_sized_f) {
        p = malloc(100);
        use(p, 100);
        free_sized_f(p, 100);
    }
    if (free_aligned_sized_f) {
        p = aligned_alloc(64, 128);
        use(p, 128);
        free_aligned_sized_f(p, 64, 128);
    }
    if (cfree_f) {
        p = malloc(100);
        use(p, 100);
        cfree_f(p);
    }

    printf("replaced.c: %d failed checks\n", failures);
    return failures ? 1 : 0;
}
