/* A parallel loop over a range for b2b's memory-bound C kernels (cpu_adamw.c): plain pthreads
 * that exist only during the call, as cpu_attention.c's (see there why not OpenMP). Static
 * inline only: each kernel file includes it.
 */
#ifndef B2B_CPU_PAR_H
#define B2B_CPU_PAR_H
#include <pthread.h>

int b2b_threads(void); /* cpu_attention.c: the cores, at most 8, or b2b_set_threads' limit */

typedef void (*range_fn)(void *ctx, long lo, long hi, int part);

typedef struct {
    range_fn fn;
    void *ctx;
    long lo, hi;
    int part;
} RangePart;

static void *range_part(void *arg) {
    RangePart *r = arg;
    r->fn(r->ctx, r->lo, r->hi, r->part);
    return NULL;
}

/* fn over [0, n) in contiguous parts, one per thread (the caller runs the first); one part
 * below `min_per_thread` elements a thread (starting a thread costs ~20-50 us). Returns the
 * number of parts: fn's `part` argument runs over 0 .. parts - 1. */
static int parallel_range(long n, long min_per_thread, range_fn fn, void *ctx) {
    int parts = b2b_threads(); /* 1 to 8 */
    if (n / parts < min_per_thread) parts = n / min_per_thread > 1 ? (int)(n / min_per_thread) : 1;
    RangePart r[8];
    pthread_t tid[8];
    int started[8] = {0};
    for (int t = 0; t < parts; t++) r[t] = (RangePart){fn, ctx, n * t / parts, n * (t + 1) / parts, t};
    for (int t = 1; t < parts; t++) started[t] = pthread_create(&tid[t], NULL, range_part, &r[t]) == 0;
    range_part(&r[0]);
    for (int t = 1; t < parts; t++) {
        if (started[t]) pthread_join(tid[t], NULL);
        else range_part(&r[t]); /* no thread: still done, here */
    }
    return parts;
}
#endif
