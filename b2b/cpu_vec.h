/* Float vectors as wide as the CPU's registers, and a vector exp, for b2b's C kernels
 * (cpu_step.c, cpu_vocab_loss.c, cpu_attention.c). GCC/Clang vector extensions: portable, unaligned loads and
 * stores through memcpy. Static inline only: each kernel file includes it.
 */
#ifndef B2B_CPU_VEC_H
#define B2B_CPU_VEC_H
#include <string.h>

#if defined(__AVX512F__)
#define VW 16
#elif defined(__AVX__)
#define VW 8
#else
#define VW 4
#endif
typedef float vf __attribute__((vector_size(VW * sizeof(float))));
typedef int vi __attribute__((vector_size(VW * sizeof(int))));

static inline vf load(const float *p) {
    vf v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline void store(float *p, vf v) { memcpy(p, &v, sizeof v); }

static inline vf splat(float x) { return (vf){0} + x; }

/* Lane-wise maximum (C has no vector ?:). */
static inline vf vmaximum(vf a, vf b) {
    const vi a_wins = a > b;
    return (vf)(((vi)a & a_wins) | ((vi)b & ~a_wins));
}

static inline float hmax(vf v) {
    float m = v[0];
    for (int i = 1; i < VW; i++) m = v[i] > m ? v[i] : m;
    return m;
}

static inline float hsum(vf v) {
    float s = 0.0f;
    for (int i = 0; i < VW; i++) s += v[i];
    return s;
}

/* e^x for a vector, to ~2e-7 relative (Cody-Waite reduction, degree-6 Taylor on |f| <= ln2/2);
 * 0 below -87 (expf there is below 1.7e-38: nothing a softmax or its sum can tell from 0).
 * libm's expf is scalar. */
static inline vf vexp(vf x) {
    const vf hi = (vf){0} + 88.0f, lo = (vf){0} + -87.0f;
    const vi over = x > hi, under = x < lo;
    x = (vf)(((vi)x & ~over) | ((vi)hi & over));
    x = (vf)(((vi)x & ~under) | ((vi)lo & under));
    const vf r = (x * 1.44269504f + 12582912.0f) - 12582912.0f; /* round(x / ln 2) */
    const vf f = x - r * 0.693145751953125f - r * 1.428606765330187e-06f;
    const vf p = 1.0f + f * (1.0f + f * (0.5f + f * (1.6666667e-1f + f * (4.1666668e-2f + f * (8.3333338e-3f + f * 1.3888889e-3f)))));
    const vi scale = (__builtin_convertvector(r, vi) + 127) << 23; /* 2^r */
    return (vf)((vi)(p * (vf)scale) & ~under);
}
#endif
