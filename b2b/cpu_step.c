/* One decoding step of a b2b decoder in plain C, for MLX's CPU backend (see cpu_step.py).
 *
 * Why: a step reads ~100 MB of weights once (memory-bound: ~4.5 ms on the 2-core machine this
 * was written on) but MLX ran it as ~600 kernels at ~3-10 us of fixed cost each, so most of a
 * step was dispatch, not arithmetic (greedy ~10 ms, beam 4 ~24 ms a step). Here the same step
 * is a few OpenMP loops over the model's own float32 arrays (shared with MLX, not copied), or
 * float16 copies of its matrices where those hold the same values (half the bytes to stream).
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

/* Threads for a parallel loop: b2b_step_set_threads's number, else OMP_NUM_THREADS or the cores,
 * at most 8 (a step's products are memory-bound and small: more threads add more
 * synchronisation than bandwidth). A step has a few parallel loops per layer; each ends in a
 * barrier, so a team thread that another process's work keeps off its core stalls the whole
 * step for a scheduler time slice: beside one busy process on 2 cores a step took ~2.5x as long
 * with 2 threads as with 1 (cpu_step.py picks the number from how busy the cores are). */
static int step_threads = 0; /* set between steps, from the thread that runs them */

void b2b_step_set_threads(int n) { step_threads = n < 0 ? 0 : n; }

static int threads(void) {
    int n = step_threads > 0 ? step_threads : omp_get_max_threads();
    return n < 8 ? n : 8;
}

static float dot(const float *a, const float *b, int n) {
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

#include "cpu_vec.h" /* VW, vf, vi, load, hsum, vexp */

/* Float16 copies of weight matrices (see cpu_step.py: only where they hold the same values)
 * halve the bytes a step streams from memory; products still add up in float32. Where the
 * compiler has no fast float16 -> float32 conversion, none are used (b2b_half_supported). */
#if defined(__F16C__) && (VW == 16 || VW == 8)
#include <immintrin.h>
#define HALF 1
typedef unsigned short hf;
static inline vf load_h(const hf *p) { /* intrinsics: GCC 12 scalarizes __builtin_convertvector here */
#if VW == 16
    return (vf)_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
#else
    return (vf)_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
#endif
}
static inline float half_to_float(hf h) { return _cvtsh_ss(h); }
#elif defined(__aarch64__)
#define HALF 1
typedef __fp16 hf;
typedef __fp16 vh __attribute__((vector_size(VW * sizeof(__fp16))));
static inline vf load_h(const hf *p) {
    vh v;
    memcpy(&v, p, sizeof v);
    return __builtin_convertvector(v, vf);
}
static inline float half_to_float(hf h) { return (float)h; }
#else
#define HALF 0
typedef unsigned short hf; /* never read */
static inline vf load_h(const hf *p) { (void)p; return (vf){0}; }
static inline float half_to_float(hf h) { (void)h; return 0.0f; }
#endif

int b2b_half_supported(void) { return HALF; }

/* dst = float16 of src (n values); returns 1 when every value survives the round trip (the copy
 * can stand in for src), else 0. Rounding to nearest even, as numpy's astype. */
int b2b_to_half(const float *src, hf *dst, long n) {
#if HALF && defined(__F16C__)
    int exact = 1;
    long i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_loadu_ps(src + i);
        __m128i h = _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        _mm_storeu_si128((__m128i *)(dst + i), h);
        __m256 back = _mm256_cvtph_ps(h);
        exact &= _mm256_movemask_ps(_mm256_cmp_ps(back, v, _CMP_EQ_OQ)) == 0xff;
    }
    for (; i < n; i++) {
        dst[i] = _cvtss_sh(src[i], _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        exact &= _cvtsh_ss(dst[i]) == src[i];
    }
    return exact;
#elif HALF
    int exact = 1;
    for (long i = 0; i < n; i++) {
        dst[i] = (hf)src[i];
        exact &= (float)dst[i] == src[i];
    }
    return exact;
#else
    (void)src, (void)dst, (void)n;
    return 0;
#endif
}

static inline float gelu(float v) { return 0.5f * v * (1.0f + erff(v * (float)M_SQRT1_2)); }

/* NR rows of x times NO rows of W (from o0), into y: an NR x NO register tile, so each load of a
 * weight vector serves NR products and each load of x serves NO. NR and NO are constants at
 * every call (always inlined): the loops unroll and the tile stays in registers. */
static inline __attribute__((always_inline)) void tile(const float *x, int in, int out, const float *W, const hf *Wh,
                                                       const float *b, float *y, int r0, int o0, int NR, int NO,
                                                       int act, int half) {
    vf acc[4][4];
    for (int r = 0; r < NR; r++)
        for (int k = 0; k < NO; k++) acc[r][k] = (vf){0};
    int i = 0;
    for (; i + VW <= in; i += VW) {
        vf w[4];
        for (int k = 0; k < NO; k++) w[k] = half ? load_h(Wh + (size_t)(o0 + k) * in + i) : load(W + (size_t)(o0 + k) * in + i);
        for (int r = 0; r < NR; r++) {
            vf xv = load(x + (size_t)(r0 + r) * in + i);
            for (int k = 0; k < NO; k++) acc[r][k] += w[k] * xv;
        }
    }
    for (int r = 0; r < NR; r++)
        for (int k = 0; k < NO; k++) {
            const float *w = W + (size_t)(o0 + k) * in, *xr = x + (size_t)(r0 + r) * in;
            float s = hsum(acc[r][k]) + (b ? b[o0 + k] : 0.0f);
            for (int j = i; j < in; j++) s += (half ? half_to_float(Wh[(size_t)(o0 + k) * in + j]) : w[j]) * xr[j];
            y[(size_t)(r0 + r) * out + o0 + k] = act ? gelu(s) : s;
        }
}

/* Output tile widths: 4 x 4 accumulators fit in AVX-512's 32 registers, 4 x 2 in AVX2's 16. */
#define NO4 (VW == 16 ? 4 : 2)

/* y (R, out) = x (R, in) W^T + b, then GELU when `act`, on every core: each thread takes a block
 * of W's rows and reads each once for all the rows of x, four rows at a time. With one row (a
 * greedy step) the product is memory-bound; with beams, load-bound without the register tile.
 * W is read from its float16 copy Wh when there is one. */
static inline __attribute__((always_inline)) void linear_as(const float *x, int R, int in, int out, const float *W,
                                                            const hf *Wh, const float *b, float *y, int act, int half) {
    const int OT = 4, blocks = (out + OT - 1) / OT;
#pragma omp parallel for schedule(static) num_threads(threads())
    for (int ob = 0; ob < blocks; ob++) {
        const int o0 = ob * OT;
        if (o0 + OT > out) { /* the last, partial block: one output at a time */
            for (int o = o0; o < out; o++)
                for (int r = 0; r < R; r++) tile(x, in, out, W, Wh, b, y, r, o, 1, 1, act, half);
            continue;
        }
        int r = 0;
        for (; r + 4 <= R; r += 4)
            for (int o = o0; o < o0 + OT; o += NO4) tile(x, in, out, W, Wh, b, y, r, o, 4, NO4, act, half);
        for (; r < R; r++) tile(x, in, out, W, Wh, b, y, r, o0, 1, 4, act, half);
    }
}

static void linear(const float *x, int R, int in, int out, const float *W, const hf *Wh, const float *b, float *y,
                   int act) {
    if (HALF && Wh)
        linear_as(x, R, in, out, W, Wh, b, y, act, 1);
    else
        linear_as(x, R, in, out, W, NULL, b, y, act, 0);
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

/* s[j] = exp(s[j] - max s) / sum, in place; nothing visible (all -inf) gives zeros. */
static void softmax_row(float *s, int n) {
    float m = -INFINITY, sum = 0.0f;
    for (int j = 0; j < n; j++) m = s[j] > m ? s[j] : m;
    if (m == -INFINITY) {
        memset(s, 0, sizeof(float) * n);
        return;
    }
    int j = 0;
    vf acc = (vf){0};
    for (; j + VW <= n; j += VW) {
        vf e = vexp(load(s + j) - m);
        memcpy(s + j, &e, sizeof e);
        acc += e;
    }
    sum = hsum(acc);
    for (; j < n; j++) sum += (s[j] = expf(s[j] - m));
    const float inv = 1.0f / sum;
    for (j = 0; j < n; j++) s[j] *= inv;
}

/* Softmax attention of nq queries (rows `stride` apart) over the same n keys/values: each key
 * is read once for all of them (the beams of one input share its cross-attention K/V). Keys
 * come as (n, D), or transposed (D, n) when `kt` (the cross-attention's: the scores are then
 * vector products over keys instead of n short dot products). mask[j] == 0 hides key j;
 * nothing visible gives zeros (as the MLX path does). `scores` holds nq * n floats. */
static void attend(const float *q, int nq, size_t stride, const float *K, int kt, const float *Vals, int n, int D,
                   float scale, const unsigned char *mask, float *scores, float *out) {
    for (int t = 0; t < nq; t++) {
        float *s = scores + (size_t)t * n;
        const float *qt = q + t * stride;
        if (kt) {
            memset(s, 0, sizeof(float) * n);
            for (int d = 0; d < D; d++) {
                const float qd = qt[d] * scale, *row = K + (size_t)d * n;
#pragma omp simd
                for (int j = 0; j < n; j++) s[j] += qd * row[j];
            }
        } else {
            for (int j = 0; j < n; j++) s[j] = dot(qt, K + (size_t)j * D, D) * scale;
        }
        if (mask)
            for (int j = 0; j < n; j++)
                if (!mask[j]) s[j] = -INFINITY;
        softmax_row(s, n);
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

/* Log-softmax of each row, in place, one row per thread. */
static void log_softmax_rows(float *y, int R, int V) {
#pragma omp parallel for schedule(static) num_threads(threads())
    for (int r = 0; r < R; r++) {
        float *row = y + (size_t)r * V, m = -INFINITY, sum = 0.0f;
        for (int v = 0; v < V; v++) m = row[v] > m ? row[v] : m;
        int v = 0;
        vf acc = (vf){0};
        for (; v + VW <= V; v += VW) acc += vexp(load(row + v) - m);
        sum = hsum(acc);
        for (; v < V; v++) sum += expf(row[v] - m);
        const float lse = m + logf(sum);
        for (v = 0; v < V; v++) row[v] -= lse;
    }
}

/* Logits (or log-probabilities) out (R, V) for tokens (R,) at `position` (and, when `hidden` is
 * not NULL, the decoder's final states (R, C) there: a pointer-generator reads them), writing
 * this step's self-attention keys/values into keys[l] / values[l] (R, H, capacity, D) at `position`.
 * cross_kt[l]: (B, H, D, S) (keys transposed), cross_v[l]: (B, H, S, D); src_mask (B, S) bytes (1 = real) or NULL. PH: NULL, or
 * float16 copies laid out as P (NULL entries: read the float32 matrix).
 * Returns 0, or -1 for a bad position or rows, -2 when memory runs out. */
int b2b_decode_step(const int *dims, float eps, const float *const *P, const hf *const *PH, int R, int B, const int *tokens, int position,
                    float *const *keys, float *const *values, const float *const *cross_kt,
                    const float *const *cross_v, int S, const unsigned char *src_mask, int log_probs, float *out,
                    float *hidden) {
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
        const hf *const *WHL = PH ? PH + GLOBALS + (size_t)l * PER_LAYER : NULL;
#define WH(i) (WHL ? WHL[i] : NULL)
        /* Causal self-attention: this token's K/V into the cache, then attend to positions 0..position. */
        linear(x, R, C, C, W[Q_W], WH(Q_W), W[Q_B], q, 0);
        linear(x, R, C, C, W[K_W], WH(K_W), W[K_B], kv, 0);
        linear(x, R, C, C, W[V_W], WH(V_W), W[V_B], kv + (size_t)R * C, 0);
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
            attend(q + (size_t)r * C + hd * D, 1, C, keys[l] + base, 0, values[l] + base, position + 1, D, scale, NULL,
                   scores + (size_t)omp_get_thread_num() * beams * span, att + (size_t)r * C + hd * D);
        }
        linear(att, R, C, C, W[O_W], WH(O_W), W[O_B], h, 0);
        add_into(x, h, (size_t)R * C);
        layer_norm(x, R, C, W[N1_G], W[N1_B], eps);

        /* Cross-attention to the input's encoder states (K/V shared by its beams). */
        linear(x, R, C, C, W[CQ_W], WH(CQ_W), W[CQ_B], q, 0);
#pragma omp parallel for schedule(static) num_threads(threads())
        for (int bh = 0; bh < B * H; bh++) {
            int b = bh / H, hd = bh % H;
            size_t base = (size_t)bh * S * D, row = (size_t)b * beams * C + hd * D;
            attend(q + row, beams, C, cross_kt[l] + base, 1, cross_v[l] + base, S, D, scale,
                   src_mask ? src_mask + (size_t)b * S : NULL, scores + (size_t)omp_get_thread_num() * beams * span,
                   att + row);
        }
        linear(att, R, C, C, W[CO_W], WH(CO_W), W[CO_B], h, 0);
        add_into(x, h, (size_t)R * C);
        layer_norm(x, R, C, W[N2_G], W[N2_B], eps);

        /* Feed-forward: Linear, exact GELU x * Phi(x), Linear. */
        linear(x, R, C, F, W[UP_W], WH(UP_W), W[UP_B], h, 1); /* GELU applied in the product */
        linear(h, R, F, C, W[DOWN_W], WH(DOWN_W), W[DOWN_B], att, 0);
        add_into(x, att, (size_t)R * C);
        layer_norm(x, R, C, W[N3_G], W[N3_B], eps);
    }

    if (hidden) memcpy(hidden, x, sizeof(float) * R * C);
    /* LM head: Linear, GELU, LayerNorm, then the tied vocabulary matrix plus its bias. */
    linear(x, R, C, C, P[TRANSFORM_W], PH ? PH[TRANSFORM_W] : NULL, P[TRANSFORM_B], h, 1);
    layer_norm(h, R, C, P[HEAD_G], P[HEAD_B], eps);
    linear(h, R, C, V, P[OUTPUT], PH ? PH[OUTPUT] : NULL, P[OUT_BIAS], out, 0); /* the tied (V, C) word table */
    if (log_probs) log_softmax_rows(out, R, V);
done:
    free(x), free(q), free(kv), free(att), free(h), free(scores);
    return status;
}

/* Beam search: row r of every cache becomes old row rows[r], for the first `filled` positions
 * (the rest is never read before it is written). Rows that keep their own beam are not copied:
 * every moved row's source is read into `tmp` first, then written. */
int b2b_reorder(const int *dims, int R, const int *rows, int filled, float *const *keys, float *const *values) {
    const int H = dims[DIM_H], D = dims[DIM_D], L = dims[DIM_L], cap = dims[DIM_CAP];
    size_t row = (size_t)H * cap * D, span = (size_t)filled * D;
    if (filled < 0 || filled > cap) return -1;
    int moved = 0;
    for (int r = 0; r < R; r++) {
        if (rows[r] < 0 || rows[r] >= R) return -1;
        moved += rows[r] != r;
    }
    if (!moved || !span) return 0;
    float *tmp = malloc(sizeof(float) * moved * H * span);
    if (!tmp) return -2;
    for (int l = 0; l < 2 * L; l++) {
        float *buf = l < L ? keys[l] : values[l - L];
        size_t k = 0;
        for (int r = 0; r < R; r++)
            if (rows[r] != r)
                for (int hd = 0; hd < H; hd++, k++)
                    memcpy(tmp + k * span, buf + rows[r] * row + (size_t)hd * cap * D, sizeof(float) * span);
        k = 0;
        for (int r = 0; r < R; r++)
            if (rows[r] != r)
                for (int hd = 0; hd < H; hd++, k++)
                    memcpy(buf + r * row + (size_t)hd * cap * D, tmp + k * span, sizeof(float) * span);
    }
    free(tmp);
    return 0;
}

static inline float log_sigmoid(float x) { return fminf(x, 0.0f) - log1pf(expf(-fabsf(x))); }

/* The pointer-generator's mixing for one decoding step (b2b/pointer.py's CopyMixer, whose NumPy
 * code it replaces on the CPU: NumPy's BLAS threads and this file's OpenMP threads fight over the
 * cores when both run in a step, measured ~30 instead of ~2 ms a step). In place on the
 * vocabulary's log-probabilities out (R, V), from the decoder's final states h (R, C):
 *   q = Wq h + bq;  a = softmax over copyable i of q . keys[b, i]  (keys pre-scaled);
 *   g = wg . [h; sum_i a_i memory[b, i]] + bg;
 *   out = logaddexp(log sigmoid(g) + out, log sigmoid(-g) + log(copy mass of the token)).
 * keys, memory: (B, S, C); wq: (C, C) as MLX stores a Linear (out, in); wg: (2C,).
 * slot: (B, S), the index of position i's token among its input's distinct copyable tokens,
 * -1 where it may not be copied; tokens: (B, U), those distinct tokens, -1 after the last;
 * nothing_to_copy: the gate logit of an input with no copyable token (pointer.py's constant).
 * attn_out: NULL, or (R, S) to receive the copy weights a (beam search's coverage penalty).
 * Returns 0, -1 for bad sizes, -2 when memory runs out. */
int b2b_copy_mix(int R, int B, int C, int S, int V, int U, const float *h, const float *wq, const float *bq,
                 const float *keys, const float *memory, const float *wg, float bg, const int *slot,
                 const int *tokens, float nothing_to_copy, float *out, float *attn_out) {
    if (B < 1 || R < B || R % B || C < 1 || S < 1 || V < 1 || U < 0) return -1;
    const int beams = R / B;
    int status = 0;
#pragma omp parallel for schedule(static) num_threads(threads())
    for (int r = 0; r < R; r++) {
        const int b = r / beams;
        const float *x = h + (size_t)r * C, *K = keys + (size_t)b * S * C, *M = memory + (size_t)b * S * C;
        const int *sl = slot + (size_t)b * S, *tok = tokens + (size_t)b * U;
        float *q = malloc(sizeof(float) * (2 * C + S + U + 1)), *row = out + (size_t)r * V;
        if (!q) {
#pragma omp atomic write
            status = -2;
            continue;
        }
        float *ctx = q + C, *a = ctx + C, *mass = a + S;
        for (int o = 0; o < C; o++) q[o] = dot(wq + (size_t)o * C, x, C) + bq[o];
        float m = -INFINITY, sum = 0.0f;
        for (int i = 0; i < S; i++) {
            a[i] = sl[i] >= 0 ? dot(q, K + (size_t)i * C, C) : -INFINITY;
            m = a[i] > m ? a[i] : m;
        }
        for (int i = 0; i < S; i++) {
            a[i] = sl[i] >= 0 ? expf(a[i] - m) : 0.0f;
            sum += a[i];
        }
        memset(ctx, 0, sizeof(float) * C);
        for (int j = 0; j < U; j++) mass[j] = 0.0f;
        for (int i = 0; i < S; i++) {
            if (a[i] == 0.0f) continue;
            const float w = a[i] / sum, *mi = M + (size_t)i * C;
            for (int c = 0; c < C; c++) ctx[c] += w * mi[c];
            mass[sl[i]] += w;
        }
        if (attn_out) {  /* the copy weights (R, S), for beam search's coverage penalty */
            float *ar = attn_out + (size_t)r * S;
            for (int i = 0; i < S; i++) ar[i] = a[i] > 0.0f ? a[i] / sum : 0.0f;
        }
        const float g = sum > 0.0f ? dot(wg, x, C) + dot(wg + C, ctx, C) + bg : nothing_to_copy;
        const float from_vocab = log_sigmoid(g), from_copy = log_sigmoid(-g);
        for (int v = 0; v < V; v++) row[v] += from_vocab;
        for (int j = 0; j < U && tok[j] >= 0; j++) {
            if (mass[j] <= 0.0f || tok[j] >= V) continue;
            const float c = from_copy + logf(mass[j]), t = row[tok[j]];
            const float hi = c > t ? c : t, lo = c > t ? t : c;
            row[tok[j]] = hi + log1pf(expf(lo - hi));
        }
        free(q);
    }
    return status;
}
