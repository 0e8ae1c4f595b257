/* The vocabulary projection and its cross-entropy, fused, forward and backward, for MLX's CPU
 * backend (ext/ops.cpp makes them MLX primitives; train/losses.py uses them).
 *
 * Why: a fine-tuning step's loss is logits = h @ W^T + bias over a 30,522-word vocabulary for
 * every target position, then a log-softmax. In MLX on the CPU that is several passes over an
 * (N, V) array (~62 MB for 508 rows), each a single-threaded compiled kernel at ~10 ns per
 * element for the exp, and each array a fresh mmap whose pages fault in again at every step:
 * ~240 ms per shard of 508 rows beyond the products themselves (minilm, this 2-core Xeon).
 * Here the products are the BLAS's sgemm and the rest is two passes per row with a vector exp;
 * rows whose weight is 0 (padding) are skipped: neither their products nor their exps are
 * computed.
 *
 * Per scored row r (label y, smoothing e, lse = log sum_j exp x_j):
 *   loss_r = lse - (1 - e) x_y - e mean_j x_j       ((1 - e) NLL + e (lse - mean x), as
 *                                                     train/losses.py computes it)
 *   d loss_r / d x_j = softmax_j - (1 - e) [j == y] - e / V
 * The forward keeps the scored rows' logits (packed, in order, at the top of an (N, V) output:
 * pages of the rest are never touched) and lse; the backward turns them into the gradient of
 * the logits, scaled by each row's cotangent, then two products give d h and d W.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_vec.h"

/* cblas_sgemm of the BLAS b2b loaded (runtime.py), set once by cpu_ops.py. */
typedef void (*sgemm_fn)(int order, int trans_a, int trans_b, int m, int n, int k, float alpha, const float *a, int lda,
                         const float *b, int ldb, float beta, float *c, int ldc);
enum { ROW_MAJOR = 101, NO_TRANS = 111, TRANS = 112 };
static sgemm_fn sgemm;

void b2b_set_sgemm(void *fn) { sgemm = (sgemm_fn)fn; }
int b2b_has_sgemm(void) { return sgemm != NULL; }

/* The scored rows (weight != 0) in order, and h's copies of them packed (na, C). Returns na,
 * -1 when out of memory, -2 when a scored row's label is outside the vocabulary. */
static long scored_rows(const float *h, const int32_t *labels, const float *weights, long N, int C, int V, long **idx,
                        float **packed) {
    long na = 0;
    for (long r = 0; r < N; r++) {
        if (weights[r] == 0.0f) continue;
        if (labels[r] < 0 || labels[r] >= V) return -2;
        na++;
    }
    *idx = malloc(sizeof(long) * (na ? na : 1));
    *packed = malloc(sizeof(float) * (size_t)(na ? na : 1) * C);
    if (!*idx || !*packed) {
        free(*idx);
        free(*packed);
        return -1;
    }
    for (long r = 0, i = 0; r < N; r++)
        if (weights[r] != 0.0f) {
            (*idx)[i] = r;
            memcpy(*packed + (size_t)i * C, h + (size_t)r * C, sizeof(float) * C);
            i++;
        }
    return na;
}

/* h (N, C), W (V, C), bias (V,), labels (N,), weights (N,), all contiguous. Writes loss and lse
 * (N,; 0 for unscored rows) and logits (N, V; the scored rows' first). Returns 0, -1 out of
 * memory, -2 a label outside the vocabulary, -3 no sgemm. */
int b2b_vocab_loss_forward(const float *h, const float *W, const float *bias, const int32_t *labels,
                           const float *weights, long N, int C, int V, float smoothing, float *loss, float *lse,
                           float *logits) {
    if (!sgemm) return -3;
    memset(loss, 0, sizeof(float) * N);
    memset(lse, 0, sizeof(float) * N);
    long *idx;
    float *hp;
    long na = scored_rows(h, labels, weights, N, C, V, &idx, &hp);
    if (na < 0) return (int)na;
    if (na) sgemm(ROW_MAJOR, NO_TRANS, TRANS, (int)na, V, C, 1.0f, hp, C, W, C, 0.0f, logits, V);
    for (long i = 0; i < na; i++) {
        float *x = logits + (size_t)i * V;
        vf vmax = (vf){0} - INFINITY, vsum = (vf){0};
        int j = 0;
        for (; j + VW <= V; j += VW) { /* bias, maximum and sum in one pass */
            vf v = load(x + j) + load(bias + j);
            store(x + j, v);
            const vi up = v > vmax; /* (C has no vector ?:) */
            vmax = (vf)(((vi)v & up) | ((vi)vmax & ~up));
            vsum += v;
        }
        float m = -INFINITY, sum = hsum(vsum);
        for (int k = 0; k < VW; k++) m = vmax[k] > m ? vmax[k] : m;
        for (; j < V; j++) {
            x[j] += bias[j];
            m = x[j] > m ? x[j] : m;
            sum += x[j];
        }
        vf vexps = (vf){0};
        for (j = 0; j + VW <= V; j += VW) vexps += vexp(load(x + j) - m);
        float exps = hsum(vexps);
        for (; j < V; j++) exps += expf(x[j] - m);
        const long r = idx[i];
        const float l = m + logf(exps);
        lse[r] = l;
        loss[r] = l - (1.0f - smoothing) * x[labels[r]] - smoothing * (sum / V);
    }
    free(idx);
    free(hp);
    return 0;
}

/* The gradients of sum_r cot[r] * loss_r: dh (N, C; 0 for unscored rows), dW (V, C), dbias (V,).
 * logits and lse as the forward left them. Returns 0, -1 out of memory, -2, -3 as the forward. */
int b2b_vocab_loss_backward(const float *h, const float *W, const int32_t *labels, const float *weights,
                            const float *logits, const float *lse, const float *cot, long N, int C, int V,
                            float smoothing, float *dh, float *dW, float *dbias) {
    if (!sgemm) return -3;
    memset(dh, 0, sizeof(float) * (size_t)N * C);
    memset(dbias, 0, sizeof(float) * V);
    long *idx;
    float *hp;
    long na = scored_rows(h, labels, weights, N, C, V, &idx, &hp);
    if (na < 0) return (int)na;
    /* The gradient of the logits: a private buffer, kept per thread (each MLX CPU stream runs
     * its tasks one after another on one thread) and grown as needed, so that its pages fault
     * in once, not at every step. It lives as long as the thread (a training shard's: the
     * process): ~40 MB for 330 scored rows of a 30,522-word vocabulary. */
    static __thread float *grad;
    static __thread size_t capacity;
    const size_t need = (size_t)na * V;
    float *dhp = malloc(sizeof(float) * (size_t)(na ? na : 1) * C);
    if (need > capacity) {
        free(grad);
        grad = malloc(sizeof(float) * need);
        capacity = grad ? need : 0;
    }
    if (!dhp || (need && !grad)) {
        free(idx);
        free(hp);
        free(dhp);
        return -1;
    }
    const float uniform = smoothing / V;
    for (long i = 0; i < na; i++) {
        const long r = idx[i];
        const float c = cot[r], l = lse[r];
        const float *x = logits + (size_t)i * V;
        float *g = grad + (size_t)i * V;
        int j = 0;
        for (; j + VW <= V; j += VW) {
            vf d = (vexp(load(x + j) - l) - uniform) * c;
            store(g + j, d);
            store(dbias + j, load(dbias + j) + d);
        }
        for (; j < V; j++) {
            g[j] = (expf(x[j] - l) - uniform) * c;
            dbias[j] += g[j];
        }
        const float hit = (1.0f - smoothing) * c;
        g[labels[r]] -= hit;
        dbias[labels[r]] -= hit;
    }
    if (na) {
        sgemm(ROW_MAJOR, NO_TRANS, NO_TRANS, (int)na, C, V, 1.0f, grad, V, W, C, 0.0f, dhp, C);
        sgemm(ROW_MAJOR, TRANS, NO_TRANS, V, C, (int)na, 1.0f, grad, V, hp, C, 0.0f, dW, C);
    } else {
        memset(dW, 0, sizeof(float) * (size_t)V * C);
    }
    for (long i = 0; i < na; i++) memcpy(dh + (size_t)idx[i] * C, dhp + (size_t)i * C, sizeof(float) * C);
    free(idx);
    free(hp);
    free(dhp);
    return 0;
}
