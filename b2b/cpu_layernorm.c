/* LayerNorm over the last axis, forward and backward, for MLX's CPU backend (ext/ops.cpp makes
 * them MLX primitives). MLX on the CPU computes LayerNorm from generic ops: ~6 passes over the
 * activations forward and ~15 backward, each a separate single-threaded loop; a fine-tuning
 * step (minilm, 4 x 512 tokens) spent ~28 ms per LayerNorm, forward and backward, in them.
 * Here one row (a token's C features, a few KB, in L1) is read twice forward and twice
 * backward. Single-threaded: the training step runs one shard per core (train/step.py).
 *
 * Forward:  mean, rstd = 1 / sqrt(var + eps); y = (x - mean) * rstd * w + b.
 * Backward: xhat = (x - mean) * rstd, g = dy * w,
 *           dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), dw = sum dy * xhat, db = sum dy.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* x, y: (rows, C) contiguous; mean, rstd: (rows,). */
void b2b_layer_norm_forward(const float *restrict x, const float *restrict w, const float *restrict b, long rows, int C,
                            float eps, float *restrict y, float *restrict mean, float *restrict rstd) {
    for (long r = 0; r < rows; r++) {
        const float *xr = x + r * C;
        float *yr = y + r * C;
        float s = 0.f;
#pragma omp simd reduction(+ : s)
        for (int c = 0; c < C; c++) s += xr[c];
        float m = s / C, v = 0.f;
#pragma omp simd reduction(+ : v)
        for (int c = 0; c < C; c++) v += (xr[c] - m) * (xr[c] - m);  /* two passes: no cancellation */
        float rs = 1.f / sqrtf(v / C + eps);
        for (int c = 0; c < C; c++) yr[c] = (xr[c] - m) * rs * w[c] + b[c];
        mean[r] = m;
        rstd[r] = rs;
    }
}

/* dx: (rows, C); dw, db: (C,), overwritten. Returns -1 when out of memory. */
int b2b_layer_norm_backward(const float *restrict x, const float *restrict w, const float *restrict mean,
                            const float *restrict rstd, const float *restrict dy, long rows, int C, float *restrict dx,
                            float *restrict dw, float *restrict db) {
    /* dw and db are summed over rows in double-width float accumulators per feature: a few
     * thousand rows of float32 terms would otherwise lose digits. (`omp simd`: vectorised sums,
     * compiled with -fopenmp-simd, no OpenMP runtime.) */
    double *restrict acc = calloc(2 * (size_t)C, sizeof(double));
    float *restrict xhat = malloc(sizeof(float) * C);
    if (!acc || !xhat) {
        free(acc);
        free(xhat);
        return -1;
    }
    for (long r = 0; r < rows; r++) {
        const float *xr = x + r * C, *dyr = dy + r * C;
        float *dxr = dx + r * C;
        float m = mean[r], rs = rstd[r], sg = 0.f, sgx = 0.f;
#pragma omp simd reduction(+ : sg, sgx)
        for (int c = 0; c < C; c++) {
            float xh = (xr[c] - m) * rs, g = dyr[c] * w[c];
            xhat[c] = xh;
            sg += g;
            sgx += g * xh;
        }
        float mg = sg / C, mgx = sgx / C;
        for (int c = 0; c < C; c++) {
            dxr[c] = rs * (dyr[c] * w[c] - mg - xhat[c] * mgx);
            acc[c] += dyr[c] * xhat[c];
            acc[C + c] += dyr[c];
        }
    }
    for (int c = 0; c < C; c++) {
        dw[c] = (float)acc[c];
        db[c] = (float)acc[C + c];
    }
    free(acc);
    free(xhat);
    return 0;
}
