/* One decoding step of a b2b decoder in plain C, for MLX's CPU backend (see cpu_step.py).
 *
 * Why: a step reads ~100 MB of weights once (memory-bound: ~4.5 ms on the 2-core machine this
 * was written on) but MLX ran it as ~600 kernels at ~3-10 us of fixed cost each, so most of a
 * step was dispatch, not arithmetic (greedy ~10 ms, beam 4 ~24 ms a step). Here the same step
 * is a few OpenMP loops over the model's own float32 arrays (shared with MLX, not copied).
 * Every product is our `linear`, not BLAS: OpenBLAS's spinning threads and OpenMP's fight
 * over the cores when both run in one step (measured: 2-3x slower).
 *
 * The maths is the model's: post-norm BERT blocks, causal self-attention over a
 * (R, H, capacity, D) cache, cross-attention over K/V projected once per input (its beams
 * share them), exact-erf GELU, the tied (V, C) word table as output matrix. Results match the
 * MLX step to float rounding (tests/test_cpu_step.py). Rows: R = B * beams; row r belongs to
 * input r / beams. A Linear's weight is (out, in) row-major, as MLX stores it.
 */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

/* Pointer table layout: the globals, then PER_LAYER entries per decoder layer. */
enum { WORD, POSITION, TYPE0, EMB_G, EMB_B, TRANSFORM_W, TRANSFORM_B, HEAD_G, HEAD_B, OUTPUT, OUT_BIAS, GLOBALS };
enum {
    Q_W, Q_B, K_W, K_B, V_W, V_B, O_W, O_B, N1_G, N1_B, /* self-attention (the encoder's with BERTShare) */
    CQ_W, CQ_B, CO_W, CO_B, N2_G, N2_B,                 /* cross-attention (K/V come projected) */
    UP_W, UP_B, DOWN_W, DOWN_B, N3_G, N3_B,             /* feed-forward */
    PER_LAYER
};
/* dims: C, H, D, F, V, L (layers), capacity (cache positions). */
enum { DIM_C, DIM_H, DIM_D, DIM_F, DIM_V, DIM_L, DIM_CAP, DIMS };

/* Threads for a parallel loop: OMP_NUM_THREADS or the cores, at most 8 (a step's products are
 * memory-bound and small: more threads add more synchronisation than bandwidth). */
static int threads(void) {
    int n = omp_get_max_threads();
    return n < 8 ? n : 8;
}

static float dot(const float *a, const float *b, int n) {
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

/* y (R, out) = x (R, in) W^T + b, on every core: each thread takes a block of W's rows and
 * reads each row once for all the rows of x (four at a time, so a row's loads serve four
 * products). The products are memory-bound: W is read once from DRAM per call. */
static void linear(const float *x, int R, int in, int out, const float *W, const float *b, float *y) {
#pragma omp parallel for schedule(static) num_threads(threads())
    for (int o = 0; o < out; o++) {
        const float *w = W + (size_t)o * in;
        float bias = b ? b[o] : 0.0f;
        int r = 0;
        for (; r + 4 <= R; r += 4) {
            const float *x0 = x + (size_t)r * in, *x1 = x0 + in, *x2 = x1 + in, *x3 = x2 + in;
            float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
#pragma omp simd reduction(+ : s0, s1, s2, s3)
            for (int i = 0; i < in; i++) {
                s0 += w[i] * x0[i];
                s1 += w[i] * x1[i];
                s2 += w[i] * x2[i];
                s3 += w[i] * x3[i];
            }
            y[(size_t)r * out + o] = s0 + bias;
            y[(size_t)(r + 1) * out + o] = s1 + bias;
            y[(size_t)(r + 2) * out + o] = s2 + bias;
            y[(size_t)(r + 3) * out + o] = s3 + bias;
        }
        for (; r < R; r++) y[(size_t)r * out + o] = dot(w, x + (size_t)r * in, in) + bias;
    }
}

static void layer_norm(float *x, int R, int C, const float *g, const float *b, float eps) {
    for (int r = 0; r < R; r++, x += C) {
        float mean = 0.0f, var = 0.0f;
        for (int i = 0; i < C; i++) mean += x[i];
        mean /= C;
        for (int i = 0; i < C; i++) var += (x[i] - mean) * (x[i] - mean);
        float inv = 1.0f / sqrtf(var / C + eps);
        for (int i = 0; i < C; i++) x[i] = (x[i] - mean) * inv * g[i] + b[i];
    }
}

static void add_into(float *x, const float *h, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] += h[i];
}

/* Softmax attention of nq queries (rows `stride` apart) over the same n keys/values (n, D):
 * each key is read once for all of them (the beams of one input share its cross-attention
 * K/V). mask[j] == 0 hides key j; nothing visible gives zeros (as the MLX path does).
 * `scores` holds nq * n floats. */
static void attend(const float *q, int nq, size_t stride, const float *K, const float *Vals, int n, int D,
                   float scale, const unsigned char *mask, float *scores, float *out) {
    for (int j = 0; j < n; j++) {
        const float *k = K + (size_t)j * D;
        for (int t = 0; t < nq; t++)
            scores[(size_t)t * n + j] = (mask && !mask[j]) ? -INFINITY : dot(q + t * stride, k, D) * scale;
    }
    for (int t = 0; t < nq; t++) {
        float *s = scores + (size_t)t * n, m = -INFINITY, sum = 0.0f;
        for (int j = 0; j < n; j++) m = s[j] > m ? s[j] : m;
        for (int j = 0; j < n; j++) {
            s[j] = s[j] == -INFINITY ? 0.0f : expf(s[j] - m);
            sum += s[j];
        }
        float inv = m == -INFINITY ? 0.0f : 1.0f / sum;
        for (int j = 0; j < n; j++) s[j] *= inv;
        memset(out + t * stride, 0, sizeof(float) * D);
    }
    for (int j = 0; j < n; j++) {
        const float *v = Vals + (size_t)j * D;
        for (int t = 0; t < nq; t++) {
            float p = scores[(size_t)t * n + j], *o = out + t * stride;
            if (p != 0.0f)
                for (int d = 0; d < D; d++) o[d] += p * v[d];
        }
    }
}

static void log_softmax_rows(float *y, int R, int V) {
    for (int r = 0; r < R; r++, y += V) {
        float m = -INFINITY, sum = 0.0f;
        for (int v = 0; v < V; v++) m = y[v] > m ? y[v] : m;
        for (int v = 0; v < V; v++) sum += expf(y[v] - m);
        float lse = m + logf(sum);
        for (int v = 0; v < V; v++) y[v] -= lse;
    }
}

/* Logits (or log-probabilities) out (R, V) for tokens (R,) at `position`, writing this step's
 * self-attention keys/values into keys[l] / values[l] (R, H, capacity, D) at `position`.
 * cross_k[l] / cross_v[l]: (B, H, S, D); src_mask (B, S) bytes (1 = real) or NULL.
 * Returns 0, or -1 for a bad position or rows, -2 when memory runs out. */
int b2b_decode_step(const int *dims, float eps, const float *const *P, int R, int B, const int *tokens, int position,
                    float *const *keys, float *const *values, const float *const *cross_k,
                    const float *const *cross_v, int S, const unsigned char *src_mask, int log_probs, float *out) {
    const int C = dims[DIM_C], H = dims[DIM_H], D = dims[DIM_D], F = dims[DIM_F], V = dims[DIM_V];
    const int L = dims[DIM_L], cap = dims[DIM_CAP];
    if (position < 0 || position >= cap || B < 1 || R < B || R % B) return -1;
    const int beams = R / B;
    const float scale = 1.0f / sqrtf((float)D);
    float *x = malloc(sizeof(float) * R * C), *q = malloc(sizeof(float) * R * C), *kv = malloc(sizeof(float) * R * C * 2);
    float *att = malloc(sizeof(float) * R * C), *h = malloc(sizeof(float) * R * (F > C ? F : C));
    const size_t span = S > cap ? S : cap; /* the most keys one query sees */
    float *scores = malloc(sizeof(float) * omp_get_max_threads() * beams * span);
    int status = (x && q && kv && att && h && scores) ? 0 : -2;
    if (status) goto done;

    for (int r = 0; r < R; r++) { /* embeddings: word + position + segment 0, then LayerNorm */
        const float *w = P[WORD] + (size_t)tokens[r] * C, *p = P[POSITION] + (size_t)position * C;
        for (int i = 0; i < C; i++) x[r * C + i] = w[i] + p[i] + P[TYPE0][i];
    }
    layer_norm(x, R, C, P[EMB_G], P[EMB_B], eps);

    for (int l = 0; l < L; l++) {
        const float *const *W = P + GLOBALS + (size_t)l * PER_LAYER;
        /* Causal self-attention: this token's K/V into the cache, then attend to positions 0..position. */
        linear(x, R, C, C, W[Q_W], W[Q_B], q);
        linear(x, R, C, C, W[K_W], W[K_B], kv);
        linear(x, R, C, C, W[V_W], W[V_B], kv + (size_t)R * C);
        for (int r = 0; r < R; r++)
            for (int hd = 0; hd < H; hd++) {
                size_t at = (((size_t)r * H + hd) * cap + position) * D;
                memcpy(keys[l] + at, kv + (size_t)r * C + hd * D, sizeof(float) * D);
                memcpy(values[l] + at, kv + (size_t)(R + r) * C + hd * D, sizeof(float) * D);
            }
#pragma omp parallel for schedule(static) num_threads(threads())
        for (int rh = 0; rh < R * H; rh++) {
            int r = rh / H, hd = rh % H;
            size_t base = (size_t)rh * cap * D;
            attend(q + (size_t)r * C + hd * D, 1, C, keys[l] + base, values[l] + base, position + 1, D, scale, NULL,
                   scores + (size_t)omp_get_thread_num() * beams * span, att + (size_t)r * C + hd * D);
        }
        linear(att, R, C, C, W[O_W], W[O_B], h);
        add_into(x, h, (size_t)R * C);
        layer_norm(x, R, C, W[N1_G], W[N1_B], eps);

        /* Cross-attention to the input's encoder states (K/V shared by its beams). */
        linear(x, R, C, C, W[CQ_W], W[CQ_B], q);
#pragma omp parallel for schedule(static) num_threads(threads())
        for (int bh = 0; bh < B * H; bh++) {
            int b = bh / H, hd = bh % H;
            size_t base = (size_t)bh * S * D, row = (size_t)b * beams * C + hd * D;
            attend(q + row, beams, C, cross_k[l] + base, cross_v[l] + base, S, D, scale,
                   src_mask ? src_mask + (size_t)b * S : NULL, scores + (size_t)omp_get_thread_num() * beams * span,
                   att + row);
        }
        linear(att, R, C, C, W[CO_W], W[CO_B], h);
        add_into(x, h, (size_t)R * C);
        layer_norm(x, R, C, W[N2_G], W[N2_B], eps);

        /* Feed-forward: Linear, exact GELU x * Phi(x), Linear. */
        linear(x, R, C, F, W[UP_W], W[UP_B], h);
        for (size_t i = 0; i < (size_t)R * F; i++) h[i] = 0.5f * h[i] * (1.0f + erff(h[i] * (float)M_SQRT1_2));
        linear(h, R, F, C, W[DOWN_W], W[DOWN_B], att);
        add_into(x, att, (size_t)R * C);
        layer_norm(x, R, C, W[N3_G], W[N3_B], eps);
    }

    /* LM head: Linear, GELU, LayerNorm, then the tied vocabulary matrix plus its bias. */
    linear(x, R, C, C, P[TRANSFORM_W], P[TRANSFORM_B], h);
    for (size_t i = 0; i < (size_t)R * C; i++) h[i] = 0.5f * h[i] * (1.0f + erff(h[i] * (float)M_SQRT1_2));
    layer_norm(h, R, C, P[HEAD_G], P[HEAD_B], eps);
    linear(h, R, C, V, P[OUTPUT], P[OUT_BIAS], out); /* the tied (V, C) word table */
    if (log_probs) log_softmax_rows(out, R, V);
done:
    free(x), free(q), free(kv), free(att), free(h), free(scores);
    return status;
}

/* Beam search: row r of every cache becomes old row rows[r], for the first `filled` positions
 * (the rest is never read before it is written). */
int b2b_reorder(const int *dims, int R, const int *rows, int filled, float *const *keys, float *const *values) {
    const int H = dims[DIM_H], D = dims[DIM_D], L = dims[DIM_L], cap = dims[DIM_CAP];
    size_t row = (size_t)H * cap * D, span = (size_t)filled * D;
    if (filled < 0 || filled > cap) return -1;
    for (int r = 0; r < R; r++)
        if (rows[r] < 0 || rows[r] >= R) return -1;
    float *tmp = malloc(sizeof(float) * R * row);
    if (!tmp) return -2;
    for (int l = 0; l < 2 * L; l++) {
        float *buf = l < L ? keys[l] : values[l - L];
        for (int r = 0; r < R; r++)
            for (int hd = 0; hd < H; hd++)
                memcpy(tmp + r * row + (size_t)hd * cap * D, buf + (size_t)rows[r] * row + (size_t)hd * cap * D,
                       sizeof(float) * span);
        for (int r = 0; r < R; r++)
            for (int hd = 0; hd < H; hd++)
                memcpy(buf + r * row + (size_t)hd * cap * D, tmp + r * row + (size_t)hd * cap * D, sizeof(float) * span);
    }
    free(tmp);
    return 0;
}
