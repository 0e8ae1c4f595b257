/* Softmax attention, forward and backward, fused, for MLX's CPU backend.
 *
 * Why: in MLX on the CPU one attention runs as ~10 separate kernels (matmul, max, masked exp,
 * sum, matmul, and five more in the backward), each a pass over a (B, H, Tq, Tk) score array
 * in memory, with MLX's scalar exp; products with an inner dimension of 32 (the head size) run
 * at ~10 GFLOP/s: ~3 s of a ~9 s fine-tuning step. Here each (batch, head) pair is one task
 * for a small pool of threads, and a block of RB query rows goes through scores, softmax and
 * output while its (RB, Tk) tile is in cache; every product is the one register-blocked kernel
 * `gemm` (register tiles), exp is a vectorised polynomial (cpu_vec.h, as wide as the CPU's vectors). Same contract as fastmath._attention:
 * q already scaled; returns the output and each row's log-normaliser, which the backward uses
 * to recompute the probabilities (flash-attention style: no (Tq, Tk) array is kept).
 *
 * Masks: an optional key mask (B rows of Tk bytes, row stride 0 to broadcast; 0 = padding)
 * and/or causal (query i sees keys j <= i + Tk - Tq). A row with no key to attend gets a zero
 * output and zero gradients. Arrays: q, k, v, out, dout given by element strides for batch,
 * head and position, the head dimension D contiguous (D % 16 == 0); results are contiguous
 * (B, H, T, D). Built with -O3 -march=native into b2b's extension (ext/, cpu_ops.py).
 */
#define _GNU_SOURCE /* sched_getaffinity, CPU_COUNT */
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cpu_vec.h" /* vf: VW floats (16 with AVX-512), vexp, splat, vmaximum */

typedef float v8 __attribute__((vector_size(32)));

static inline v8 ld(const float *p) { v8 r; memcpy(&r, p, sizeof r); return r; }
static inline void st(float *p, v8 x) { memcpy(p, &x, sizeof x); }
static inline v8 bc(float x) { return (v8){x, x, x, x, x, x, x, x}; }

/* Keep two B vectors in registers: left to itself GCC folds them into the FMAs as memory
 * operands, 8 loads where 2 do, and the product waits on the load ports (~1.4x). Only where a
 * 32-byte vector fits one register (AVX); elsewhere a no-op. */
#if defined(__x86_64__) && defined(__AVX__)
#define IN_REGISTERS(a, b) __asm__("" : "+x"(a), "+x"(b))
#else
#define IN_REGISTERS(a, b) ((void)0)
#endif

#define RB 48  /* query rows per block: its (RB, Tk) tiles stay in L2 */

#if defined(__AVX512F__)
typedef float v16 __attribute__((vector_size(64)));
static inline v16 ld16(const float *p) { v16 r; memcpy(&r, p, sizeof r); return r; }
static inline void st16(float *p, v16 x) { memcpy(p, &x, sizeof x); }
#endif

/* C (M, N) (+)= A (M, K) . B (K, N). A is read by strides (as0 between rows, as1 along K), so a
 * transposed tile needs no copy; B and C rows are contiguous with strides ldb, ldc; N % 16 == 0.
 * Where AVX-512 is available, 12-row panels in 512-bit registers (12 x 32 tiles over a k-major
 * copy of A when N is large, else 12 x 16 tiles); then 6 x 16 register tiles (then 4 x 16, then
 * single rows): per 6 x 16 tile and k, two loads of B, one broadcast of A per row, two FMAs
 * per row. */
static void gemm(int M, int N, int K, const float *A, long as0, long as1, const float *B, long ldb,
                 float *C, long ldc, int accumulate) {
    int i = 0;
#if defined(__AVX512F__)
    /* 12 x 32 tiles in 512-bit registers (then 12 x 16): per k two loads of B and twelve
     * broadcasts of A, each feeding two FMAs. The 12 rows of A are first copied k-major into
     * `ap`, so that the broadcasts are at fixed offsets from one pointer: read through A's
     * strides, each costs address arithmetic on the ports the FMAs need. (One core,
     * B4 x 12 x 512 x 32, forward + backward, with the softmax passes: 256-bit 6 x 16 tiles
     * 91 ms; 512-bit 12 x 16 tiles reading A by strides 75-79 ms; these, and the softmax
     * passes in 512-bit vectors, 69 ms.) */
    /* Where A's 12 rows are already side by side in memory (as0 == 1: a transposed tile, as
     * dK += dS^T Q reads it), the tiles read A in place; 12 x 32 tiles then pay off from 32
     * columns on (dK, dV: 512 x 32 x 48 at 99 -> ~150 GFLOP/s on one core). */
    float ap[12 * 512];
    for (; i + 12 <= M && ((as0 == 1 && N >= 32) || (K <= 512 && N >= 128)); i += 12) {
        const float *a0 = A + i * as0;
        long astep = as1;
        if (as0 != 1) { /* (the copy pays off over many columns) */
            for (int k = 0; k < K; k++)
                for (int r = 0; r < 12; r++) ap[k * 12 + r] = A[(i + r) * as0 + k * as1];
            a0 = ap, astep = 12;
        }
        int j = 0;
        for (; j + 32 <= N; j += 32) {
            v16 c[12][2];
            for (int r = 0; r < 12; r++) c[r][0] = c[r][1] = (v16){0};
            const float *b = B + j, *a = a0;
            for (int k = 0; k < K; k++, b += ldb, a += astep) {
                v16 b0 = ld16(b), b1 = ld16(b + 16);
                __asm__("" : "+v"(b0), "+v"(b1)); /* two loads of B, not 24 memory operands */
                for (int r = 0; r < 12; r++) {
                    c[r][0] += a[r] * b0;
                    c[r][1] += a[r] * b1;
                }
            }
            float *cp = C + i * ldc + j;
            for (int r = 0; r < 12; r++) {
                if (accumulate) {
                    c[r][0] += ld16(cp + r * ldc);
                    c[r][1] += ld16(cp + r * ldc + 16);
                }
                st16(cp + r * ldc, c[r][0]);
                st16(cp + r * ldc + 16, c[r][1]);
            }
        }
        for (; j < N; j += 16) {
            v16 c[12];
            for (int r = 0; r < 12; r++) c[r] = (v16){0};
            const float *b = B + j, *a = a0;
            for (int k = 0; k < K; k++, b += ldb, a += astep) {
                v16 b0 = ld16(b);
                __asm__("" : "+v"(b0));
                for (int r = 0; r < 12; r++) c[r] += a[r] * b0;
            }
            float *cp = C + i * ldc + j;
            for (int r = 0; r < 12; r++) {
                if (accumulate) c[r] += ld16(cp + r * ldc);
                st16(cp + r * ldc, c[r]);
            }
        }
    }
    for (; i + 12 <= M; i += 12) { /* 12 x 16, A read through its strides */
        const float *a0 = A + i * as0;
        for (int j = 0; j < N; j += 16) {
            v16 c[12];
            for (int r = 0; r < 12; r++) c[r] = (v16){0};
            const float *b = B + j;
            for (int k = 0; k < K; k++, b += ldb) {
                v16 b0 = ld16(b);
                __asm__("" : "+v"(b0)); /* one load of B, not twelve memory operands */
                const float *a = a0 + k * as1;
                for (int r = 0; r < 12; r++) c[r] += a[r * as0] * b0;
            }
            float *cp = C + i * ldc + j;
            for (int r = 0; r < 12; r++) {
                if (accumulate) c[r] += ld16(cp + r * ldc);
                st16(cp + r * ldc, c[r]);
            }
        }
    }
#endif
    for (; i + 6 <= M; i += 6) {  /* 6 x 16: twelve accumulators, enough FMAs in flight */
        const float *a0 = A + i * as0;
        for (int j = 0; j < N; j += 16) {
            v8 c[6][2];
            for (int r = 0; r < 6; r++) c[r][0] = c[r][1] = bc(0);
            const float *b = B + j;
            for (int k = 0; k < K; k++, b += ldb) {
                v8 b0 = ld(b), b1 = ld(b + 8);
                IN_REGISTERS(b0, b1);
                const float *a = a0 + k * as1;
                for (int r = 0; r < 6; r++) {
                    v8 x = bc(a[r * as0]);
                    c[r][0] += x * b0;
                    c[r][1] += x * b1;
                }
            }
            float *cp = C + i * ldc + j;
            for (int r = 0; r < 6; r++) {
                if (accumulate) { c[r][0] += ld(cp + r * ldc); c[r][1] += ld(cp + r * ldc + 8); }
                st(cp + r * ldc, c[r][0]);
                st(cp + r * ldc + 8, c[r][1]);
            }
        }
    }
    for (; i + 4 <= M; i += 4) {
        const float *a0 = A + i * as0, *a1 = a0 + as0, *a2 = a1 + as0, *a3 = a2 + as0;
        for (int j = 0; j < N; j += 16) {
            v8 c00 = bc(0), c01 = bc(0), c10 = bc(0), c11 = bc(0), c20 = bc(0), c21 = bc(0), c30 = bc(0), c31 = bc(0);
            const float *b = B + j;
            for (int k = 0; k < K; k++, b += ldb) {
                v8 b0 = ld(b), b1 = ld(b + 8);
                IN_REGISTERS(b0, b1);
                long o = k * as1;
                v8 x0 = bc(a0[o]), x1 = bc(a1[o]), x2 = bc(a2[o]), x3 = bc(a3[o]);
                c00 += x0 * b0; c01 += x0 * b1;
                c10 += x1 * b0; c11 += x1 * b1;
                c20 += x2 * b0; c21 += x2 * b1;
                c30 += x3 * b0; c31 += x3 * b1;
            }
            float *c = C + i * ldc + j;
            if (accumulate) {
                c00 += ld(c); c01 += ld(c + 8); c10 += ld(c + ldc); c11 += ld(c + ldc + 8);
                c20 += ld(c + 2 * ldc); c21 += ld(c + 2 * ldc + 8); c30 += ld(c + 3 * ldc); c31 += ld(c + 3 * ldc + 8);
            }
            st(c, c00); st(c + 8, c01); st(c + ldc, c10); st(c + ldc + 8, c11);
            st(c + 2 * ldc, c20); st(c + 2 * ldc + 8, c21); st(c + 3 * ldc, c30); st(c + 3 * ldc + 8, c31);
        }
    }
    for (; i < M; i++) {
        const float *a = A + i * as0;
        for (int j = 0; j < N; j += 16) {
            v8 c0 = bc(0), c1 = bc(0);
            const float *b = B + j;
            for (int k = 0; k < K; k++, b += ldb) {
                v8 x = bc(a[k * as1]);
                c0 += x * ld(b); c1 += x * ld(b + 8);
            }
            float *c = C + i * ldc + j;
            if (accumulate) { c0 += ld(c); c1 += ld(c + 8); }
            st(c, c0); st(c + 8, c1);
        }
    }
}

typedef struct {
    int B, H, Tq, Tk, D, causal;
    const uint8_t *key_mask;  /* (B or 1, Tk) or NULL */
    long mask_b;              /* its batch stride: Tk, or 0 to broadcast */
} Shape;

/* Per-thread scratch. Tkp = Tk rounded up to 16 (the padding keys are masked). */
typedef struct {
    int Tkp;
    float *kt, *vt, *madd, *s, *p, *qb, *db;
} Scratch;

static size_t scratch_floats(const Shape *sh) {
    size_t Tkp = (sh->Tk + 15) / 16 * 16;
    return 2 * sh->D * Tkp + Tkp + 2 * RB * Tkp + 2 * RB * sh->D;
}

/* Thread t's part of one allocation made before the threads start. */
static Scratch scratch_at(float *mem, int t, const Shape *sh) {
    Scratch w;
    w.Tkp = (sh->Tk + 15) / 16 * 16;
    size_t tile = (size_t)RB * w.Tkp, pack = (size_t)sh->D * w.Tkp, rows = (size_t)RB * sh->D;
    w.kt = mem + t * scratch_floats(sh); w.vt = w.kt + pack; w.madd = w.vt + pack;
    w.s = w.madd + w.Tkp; w.p = w.s + tile; w.qb = w.p + tile; w.db = w.qb + rows;
    return w;
}

/* (T, D) rows at stride `ts` -> (D, Tkp) columns, zero beyond T. */
static void pack_t(const float *x, long ts, int T, int D, int Tkp, float *out) {
    for (int c = 0; c < D; c++) {
        float *o = out + (size_t)c * Tkp;
        for (int j = 0; j < T; j++) o[j] = x[j * ts + c];
        for (int j = T; j < Tkp; j++) o[j] = 0.0f;
    }
}

/* `rows` rows at stride `ts` -> a contiguous (RB, D) block, zero rows beyond `rows`. */
static void pack_rows(const float *x, long ts, int rows, int D, float *out) {
    for (int r = 0; r < RB; r++) {
        if (r < rows) memcpy(out + r * D, x + r * ts, sizeof(float) * D);
        else memset(out + r * D, 0, sizeof(float) * D);
    }
}

/* 0 for keys that may be attended, -inf for padding (and the round-up to Tkp). */
static void key_bias(const Shape *sh, int b, int Tkp, float *madd) {
    const uint8_t *km = sh->key_mask ? sh->key_mask + b * sh->mask_b : NULL;
    for (int j = 0; j < Tkp; j++) madd[j] = (j < sh->Tk && (!km || km[j])) ? 0.0f : -INFINITY;
}

/* Scores of rows i0.. (already in w->s) plus the mask: -inf where a key is not attended. */
static void mask_scores(const Shape *sh, const Scratch *w, int i0, int rows) {
    for (int r = 0; r < rows; r++) {
        float *s = w->s + (size_t)r * w->Tkp;
        for (int j = 0; j < w->Tkp; j += VW) store(s + j, load(s + j) + load(w->madd + j));
        if (sh->causal) {
            int limit = i0 + r + sh->Tk - sh->Tq + 1;  /* first key this row may not see */
            for (int j = limit < 0 ? 0 : limit; j < w->Tkp; j++) s[j] = -INFINITY;
        }
    }
}

/* Rows are Tkp long: a multiple of 16, so of VW. */
static float row_max(const float *s, int n) {
    vf m = splat(-INFINITY);
    for (int j = 0; j < n; j += VW) m = vmaximum(load(s + j), m);
    return hmax(m);
}

/* p = exp(s - shift) over a row; returns the sum. A shift of -inf (no key) gives zeros. */
static float row_exp(const float *s, float shift, int n, float *p) {
    if (shift == -INFINITY) { memset(p, 0, sizeof(float) * n); return 0.0f; }
    vf sum = splat(0.0f), sh = splat(shift);
    for (int j = 0; j < n; j += VW) {
        vf e = vexp(load(s + j) - sh);
        store(p + j, e);
        sum += e;
    }
    return hsum(sum);
}

/* Threads for one call: the cores, at most 8. Plain pthreads, not OpenMP: MLX calls this from
 * its own stream thread, and a second OpenMP team beside the C decoding step's (called from
 * Python's thread) makes libgomp throttle every team's spin-waits: decoding steps went from
 * ~6 to ~10 ms. These threads exist only during a call. */
static _Atomic int thread_limit = 0; /* b2b_set_threads; 0: no limit */

void b2b_set_threads(int n) { atomic_store(&thread_limit, n < 0 ? 0 : n); }

int b2b_threads(void) { /* (also cpu_par.h's) */
    int limit = atomic_load(&thread_limit);
    if (limit > 0 && limit <= 8) return limit;
#ifdef __linux__
    cpu_set_t set;  /* the CPUs this process may use (a container's, a taskset's) */
    long n = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : sysconf(_SC_NPROCESSORS_ONLN);
#else
    long n = sysconf(_SC_NPROCESSORS_ONLN);
#endif
    return n < 1 ? 1 : n > 8 ? 8 : (int)n;
}

/* Everything one call reads and writes; the backward fields are NULL in a forward call. */
typedef struct {
    Shape sh;
    const float *q, *k, *v, *dout;
    const long *qs, *ks, *vs, *ds;
    float *out, *lse;              /* forward: written; backward: read */
    float *dq, *dk, *dv;
} Args;

/* Forward for one (batch, head): out and lse rows, a block of RB query rows at a time. */
static void forward_head(const Args *a, Scratch *w, int bh) {
    const Shape *sh = &a->sh;
    int b = bh / sh->H, h = bh % sh->H, Tq = sh->Tq, Tk = sh->Tk, D = sh->D;
    const float *qh = a->q + b * a->qs[0] + h * a->qs[1], *kh = a->k + b * a->ks[0] + h * a->ks[1];
    const float *vh = a->v + b * a->vs[0] + h * a->vs[1];
    float *oh = a->out + (size_t)bh * Tq * D, *lh = a->lse + (size_t)bh * Tq;
    pack_t(kh, a->ks[2], Tk, D, w->Tkp, w->kt);
    key_bias(sh, b, w->Tkp, w->madd);
    for (int i0 = 0; i0 < Tq; i0 += RB) {
        int rows = Tq - i0 < RB ? Tq - i0 : RB;
        pack_rows(qh + i0 * a->qs[2], a->qs[2], rows, D, w->qb);
        gemm(rows, w->Tkp, D, w->qb, D, 1, w->kt, w->Tkp, w->s, w->Tkp, 0);  /* S = Q K^T */
        mask_scores(sh, w, i0, rows);
        float inv[RB];
        for (int r = 0; r < rows; r++) {
            float m = row_max(w->s + (size_t)r * w->Tkp, w->Tkp);
            float l = row_exp(w->s + (size_t)r * w->Tkp, m, w->Tkp, w->p + (size_t)r * w->Tkp);
            inv[r] = l > 0.0f ? 1.0f / l : 0.0f;
            lh[i0 + r] = l > 0.0f ? m + logf(l) : 0.0f;
        }
        /* O = P V over the real keys; normalised per row afterwards. */
        gemm(rows, D, Tk, w->p, w->Tkp, 1, vh, a->vs[2], oh + (size_t)i0 * D, D, 0);
        for (int r = 0; r < rows; r++)
            for (int c = 0; c < D; c++) oh[(size_t)(i0 + r) * D + c] *= inv[r];
    }
}

/* Backward for one (batch, head): the probabilities recomputed from lse, then dQ, dK, dV. */
static void backward_head(const Args *a, Scratch *w, int bh) {
    const Shape *sh = &a->sh;
    int b = bh / sh->H, h = bh % sh->H, Tq = sh->Tq, Tk = sh->Tk, D = sh->D;
    const float *qh = a->q + b * a->qs[0] + h * a->qs[1], *kh = a->k + b * a->ks[0] + h * a->ks[1];
    const float *vh = a->v + b * a->vs[0] + h * a->vs[1], *doh = a->dout + b * a->ds[0] + h * a->ds[1];
    const float *oh = a->out + (size_t)bh * Tq * D, *lh = a->lse + (size_t)bh * Tq;
    float *dqh = a->dq + (size_t)bh * Tq * D, *dkh = a->dk + (size_t)bh * Tk * D, *dvh = a->dv + (size_t)bh * Tk * D;
    memset(dkh, 0, sizeof(float) * Tk * D);
    memset(dvh, 0, sizeof(float) * Tk * D);
    pack_t(kh, a->ks[2], Tk, D, w->Tkp, w->kt);
    pack_t(vh, a->vs[2], Tk, D, w->Tkp, w->vt);
    key_bias(sh, b, w->Tkp, w->madd);
    for (int i0 = 0; i0 < Tq; i0 += RB) {
        int rows = Tq - i0 < RB ? Tq - i0 : RB;
        pack_rows(qh + i0 * a->qs[2], a->qs[2], rows, D, w->qb);
        pack_rows(doh + i0 * a->ds[2], a->ds[2], rows, D, w->db);
        gemm(rows, w->Tkp, D, w->qb, D, 1, w->kt, w->Tkp, w->s, w->Tkp, 0);  /* S = Q K^T */
        mask_scores(sh, w, i0, rows);
        for (int r = 0; r < rows; r++)  /* P; a row with no key is all -inf: zeros */
            row_exp(w->s + (size_t)r * w->Tkp, lh[i0 + r], w->Tkp, w->p + (size_t)r * w->Tkp);
        gemm(rows, w->Tkp, D, w->db, D, 1, w->vt, w->Tkp, w->s, w->Tkp, 0);  /* dP = dO V^T, over S */
        for (int r = 0; r < rows; r++) {  /* dS = P (dP - rowsum(dO * O)), over dP */
            const float *o = oh + (size_t)(i0 + r) * D, *d = w->db + r * D;
            float delta = 0.0f;
            for (int c = 0; c < D; c++) delta += d[c] * o[c];
            float *s = w->s + (size_t)r * w->Tkp, *p = w->p + (size_t)r * w->Tkp;
            vf dl = splat(delta);
            for (int j = 0; j < w->Tkp; j += VW) store(s + j, load(p + j) * (load(s + j) - dl));
        }
        gemm(rows, D, Tk, w->s, w->Tkp, 1, kh, a->ks[2], dqh + (size_t)i0 * D, D, 0);  /* dQ = dS K */
        gemm(Tk, D, rows, w->s, 1, w->Tkp, w->qb, D, dkh, D, 1);  /* dK += dS^T Q */
        gemm(Tk, D, rows, w->p, 1, w->Tkp, w->db, D, dvh, D, 1);  /* dV += P^T dO */
    }
}

/* Each (batch, head) pair is one task; threads take the next one until none is left. */
typedef struct {
    const Args *a;
    void (*head)(const Args *, Scratch *, int);
    float *mem;
    atomic_int next;
} Pool;

typedef struct {
    Pool *pool;
    int id;
} Worker;

static void *work(void *arg) {
    Worker *me = arg;
    Pool *p = me->pool;
    Scratch w = scratch_at(p->mem, me->id, &p->a->sh);
    for (int bh; (bh = atomic_fetch_add(&p->next, 1)) < p->a->sh.B * p->a->sh.H;) p->head(p->a, &w, bh);
    return NULL;
}

static int run(const Args *a, void (*head)(const Args *, Scratch *, int)) {
    const Shape *sh = &a->sh;
    if (sh->D % 16 || sh->B <= 0 || sh->H <= 0 || sh->Tq <= 0 || sh->Tk <= 0) return -1;
    int nt = b2b_threads();
    if (nt > sh->B * sh->H) nt = sh->B * sh->H;
    float *mem = malloc(sizeof(float) * scratch_floats(sh) * nt);
    if (!mem) return -2;
    Pool pool = {a, head, mem, 0};
    Worker workers[8];
    pthread_t tids[8];
    int started = 0;
    for (int t = 1; t < nt; t++) {  /* the calling thread is worker 0 */
        workers[t] = (Worker){&pool, t};
        if (pthread_create(&tids[t], NULL, work, &workers[t]) != 0) break;  /* fewer threads: still correct */
        started = t;
    }
    workers[0] = (Worker){&pool, 0};
    work(&workers[0]);
    for (int t = 1; t <= started; t++) pthread_join(tids[t], NULL);
    free(mem);
    return 0;
}
int b2b_attention_forward(const float *q, const long *qs, const float *k, const long *ks, const float *v,
                          const long *vs, const uint8_t *key_mask, long mask_b, int causal, int B, int H, int Tq,
                          int Tk, int D, float *out, float *lse) {
    Args a = {{B, H, Tq, Tk, D, causal, key_mask, mask_b}, q, k, v, NULL, qs, ks, vs, NULL, out, lse, NULL, NULL, NULL};
    return run(&a, forward_head);
}

int b2b_attention_backward(const float *q, const long *qs, const float *k, const long *ks, const float *v,
                           const long *vs, const uint8_t *key_mask, long mask_b, int causal, int B, int H, int Tq,
                           int Tk, int D, const float *out, const float *lse, const float *dout, const long *ds,
                           float *dq, float *dk, float *dv) {
    Args a = {{B, H, Tq, Tk, D, causal, key_mask, mask_b}, q, k, v, dout, qs, ks, vs, ds, (float *)out, (float *)lse,
              dq, dk, dv};
    return run(&a, backward_head);
}
