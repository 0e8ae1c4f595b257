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

/* coef: scale, decay, c1, c2 (arrays: they change at every step). hyper: b1, 1 - b1, b2, 1 - b2,
 * eps (the differences rounded from double, as Python computes them for MLX). */
void b2b_adamw(const float *p, const float *g, const float *m, const float *v, long n, const float *coef,
               const float *hyper, float *p_out, float *m_out, float *v_out) {
    const float scale = coef[0], decay = coef[1], c1 = coef[2], c2 = coef[3];
    const float b1 = hyper[0], b1c = hyper[1], b2 = hyper[2], b2c = hyper[3], eps = hyper[4];
#pragma omp simd
    for (long i = 0; i < n; i++) {
        const float gi = g[i] * scale;
        const float mi = b1 * m[i] + b1c * gi;
        const float vi = b2 * v[i] + b2c * (gi * gi);
        p_out[i] = p[i] * decay - (c1 * mi) / (sqrtf(vi) * c2 + eps);
        m_out[i] = mi;
        v_out[i] = vi;
    }
}

/* sum of x[i]^2 over n floats, in double: the gradients' global norm (train/optim.py) is the
 * square root of these summed over every parameter. MLX's reductions run one element at a time
 * (~70 ms for minilm's 26M gradients here). */
double b2b_sum_squares(const float *x, long n) {
    double total = 0.0;
    for (long i0 = 0; i0 < n; i0 += 4096) { /* float partial sums over short blocks */
        const long end = i0 + 4096 < n ? i0 + 4096 : n;
        float s = 0.0f;
#pragma omp simd reduction(+ : s)
        for (long i = i0; i < end; i++) s += x[i] * x[i];
        total += s;
    }
    return total;
}
