/* One AdamW update of a parameter, fused, and the gradients' squared norm, for MLX's CPU backend (ext/ops.cpp makes it an MLX
 * primitive; train/optim.py uses it).
 *
 * Why: MLX's AdamW compiles to one elementwise kernel per parameter, but on the CPU that
 * kernel's square root and division run one element at a time: ~13 ns per element here, ~0.25 s
 * of every fine-tuning step for minilm's 26M parameters, on one core while the other waits.
 * This loop vectorises (sqrt and division in SIMD), reads and writes each array once, and
 * updates in place when MLX hands over the input buffers.
 *
 * The maths is mlx.optimizers.AdamW's, with the gradient scaled first (clipping):
 *   g = scale * grad;  m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
 *   p = p * decay - c1 * m / (sqrt(v) * c2 + eps)
 * with decay = 1 - lr * weight_decay and, without bias correction, c1 = lr and c2 = 1 (with it,
 * c1 = lr / (1 - b1^t), c2 = 1 / sqrt(1 - b2^t)): the caller computes those four numbers.
 * p_out, m_out, v_out may be p, m, v themselves (element i is read before it is written).
 */
#include <math.h>

#include "cpu_par.h" /* parallel_range */

/* Each is memory-bound (an update reads 4 and writes 3 floats an element): one core moves
 * ~8 GB/s here, so the big arrays are split over the cores (26M parameters: ~87 -> ~50 ms). */
#define MIN_PER_THREAD (1L << 16)

typedef struct {
    const float *p, *g, *m, *v, *coef, *hyper;
    float *p_out, *m_out, *v_out;
} AdamW;

/* coef: scale, decay, c1, c2 (arrays: they change at every step). hyper: b1, 1 - b1, b2, 1 - b2,
 * eps (the differences rounded from double, as Python computes them for MLX). */
static void adamw_range(void *ctx, long lo, long hi, int part) {
    const AdamW *a = ctx;
    (void)part;
    const float scale = a->coef[0], decay = a->coef[1], c1 = a->coef[2], c2 = a->coef[3];
    const float b1 = a->hyper[0], b1c = a->hyper[1], b2 = a->hyper[2], b2c = a->hyper[3], eps = a->hyper[4];
    const float *p = a->p, *g = a->g, *m = a->m, *v = a->v;
    float *p_out = a->p_out, *m_out = a->m_out, *v_out = a->v_out;
#pragma omp simd
    for (long i = lo; i < hi; i++) {
        const float gi = g[i] * scale;
        const float mi = b1 * m[i] + b1c * gi;
        const float vi = b2 * v[i] + b2c * (gi * gi);
        p_out[i] = p[i] * decay - (c1 * mi) / (sqrtf(vi) * c2 + eps);
        m_out[i] = mi;
        v_out[i] = vi;
    }
}

void b2b_adamw(const float *p, const float *g, const float *m, const float *v, long n, const float *coef,
               const float *hyper, float *p_out, float *m_out, float *v_out) {
    AdamW a = {p, g, m, v, coef, hyper, p_out, m_out, v_out};
    parallel_range(n, MIN_PER_THREAD, adamw_range, &a);
}

/* sum of x[i]^2 over n floats, in double, float partial sums over short blocks. */
static double sum_squares(const float *x, long n) {
    double total = 0.0;
    for (long i0 = 0; i0 < n; i0 += 4096) {
        const long end = i0 + 4096 < n ? i0 + 4096 : n;
        float s = 0.0f;
#pragma omp simd reduction(+ : s)
        for (long i = i0; i < end; i++) s += x[i] * x[i];
        total += s;
    }
    return total;
}

typedef struct {
    const float *const *xs;
    const long *ns;
    int count;
    double totals[8];
} Squares;

/* Elements lo .. hi of the arrays laid end to end. */
static void squares_range(void *ctx, long lo, long hi, int part) {
    Squares *s = ctx;
    double total = 0.0;
    long start = 0; /* of array i in the concatenation */
    for (int i = 0; i < s->count && start < hi; start += s->ns[i], i++) {
        const long a = lo > start ? lo - start : 0, b = hi - start < s->ns[i] ? hi - start : s->ns[i];
        if (a < b) total += sum_squares(s->xs[i] + a, b - a);
    }
    s->totals[part] = total;
}

/* The sum of squares of every element of `count` arrays: the gradients' global norm
 * (train/optim.py) is its square root. MLX's reductions run one element at a time (~70 ms for
 * minilm's 26M gradients here). */
double b2b_sum_squares(const float *const *xs, const long *ns, int count) {
    Squares s = {xs, ns, count, {0}};
    long n = 0;
    for (int i = 0; i < count; i++) n += ns[i];
    const int parts = parallel_range(n, MIN_PER_THREAD, squares_range, &s);
    double total = 0.0;
    for (int t = 0; t < parts; t++) total += s.totals[t];
    return total;
}
