/* nnmem: bytes in use by malloc in this process, and their high-water mark since the last reset.

   Loaded with LD_PRELOAD into a measuring child process (nnmem/measure/mallocpeak.py builds it with the
   system's C compiler). Every malloc-family call goes to glibc's own implementation (__libc_*); the bytes of
   each block are its malloc_usable_size, added on allocation and subtracted on free, with atomics since
   XLA's and YNNPACK's worker threads allocate concurrently. The high-water mark is updated with a
   compare-and-swap loop. Python reads the counters through ctypes. */
#include <stddef.h>
#include <stdint.h>
#include <errno.h>

extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void *__libc_memalign(size_t, size_t);
extern void __libc_free(void *);
extern size_t malloc_usable_size(void *);

static int64_t current, peak;

static void grew(int64_t n) {
    int64_t now = __atomic_add_fetch(&current, n, __ATOMIC_RELAXED);
    int64_t seen = __atomic_load_n(&peak, __ATOMIC_RELAXED);
    while (now > seen && !__atomic_compare_exchange_n(&peak, &seen, now, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {}
}
static void *counted(void *p) { if (p) grew((int64_t)malloc_usable_size(p)); return p; }

void *malloc(size_t n) { return counted(__libc_malloc(n)); }
void *calloc(size_t k, size_t n) { return counted(__libc_calloc(k, n)); }
void free(void *p) {
    if (!p) return;
    __atomic_sub_fetch(&current, (int64_t)malloc_usable_size(p), __ATOMIC_RELAXED);
    __libc_free(p);
}
void *realloc(void *p, size_t n) {
    size_t old = p ? malloc_usable_size(p) : 0;
    void *q = __libc_realloc(p, n);
    if (q) { __atomic_sub_fetch(&current, (int64_t)old, __ATOMIC_RELAXED); grew((int64_t)malloc_usable_size(q)); }
    else if (p && n == 0) __atomic_sub_fetch(&current, (int64_t)old, __ATOMIC_RELAXED);
    return q;
}
void *memalign(size_t a, size_t n) { return counted(__libc_memalign(a, n)); }
void *aligned_alloc(size_t a, size_t n) { return counted(__libc_memalign(a, n)); }
int posix_memalign(void **out, size_t a, size_t n) {
    if (a < sizeof(void *) || (a & (a - 1))) return EINVAL;
    void *p = __libc_memalign(a, n);
    if (!p && n) return ENOMEM;
    *out = counted(p);
    return 0;
}
void *valloc(size_t n) { return counted(__libc_memalign(4096, n)); }

int64_t nnmem_malloc_current(void) { return __atomic_load_n(&current, __ATOMIC_RELAXED); }
int64_t nnmem_malloc_peak(void) { return __atomic_load_n(&peak, __ATOMIC_RELAXED); }
void nnmem_malloc_reset_peak(void) { __atomic_store_n(&peak, __atomic_load_n(&current, __ATOMIC_RELAXED), __ATOMIC_RELAXED); }
