/* Dropout, forward and backward, for MLX's CPU backend (ext/ops.cpp makes it an MLX primitive;
 * layers.Dropout uses it in training).
 *
 * Why: MLX's dropout draws a 32-bit threefry word per element, turns it into a float and
 * compares it (mx.random.bernoulli), then multiplies by the mask; the backward multiplies by
 * the kept mask again: ~3 % of a minilm fine-tuning step's CPU time. Here element i is kept
 * when a hash of (seed, i) is below a threshold: one pass forward, and the backward recomputes
 * the same mask from the seed (no mask is stored).
 *
 * The hash is murmur3's 32-bit finaliser of i mixed with the two seed words (drawn from MLX's
 * random state by the caller, so mx.random.seed makes it reproducible). Keep probability
 * threshold / 2^32; kept elements are scaled by `scale` (2^32 / threshold, exactly unbiased).
 */
#include <stdint.h>
#include <string.h>

#include "cpu_vec.h" /* VW, vf, load, store */

typedef uint32_t vu __attribute__((vector_size(VW * sizeof(uint32_t))));

static inline vu mix(vu h) { /* murmur3 fmix32 */
    h ^= h >> 16;
    h *= 0x85ebca6bu;
    h ^= h >> 13;
    h *= 0xc2b2ae35u;
    h ^= h >> 16;
    return h;
}

/* dst[i] = src[i] * scale where element i is kept, else 0, for i in [0, n). The forward applies
 * it to x; the backward, with the same seed, to dy (the gradient is the same mask and scale). */
void b2b_dropout(const float *src, long n, const uint32_t *seed, uint32_t threshold, float scale, float *dst) {
    vu lane;
    for (int l = 0; l < VW; l++) lane[l] = (uint32_t)l;
    const vu s0 = (vu){0} + seed[0], s1 = (vu){0} + seed[1], th = (vu){0} + threshold;
    const vf sc = splat(scale);
    long i = 0;
    for (; i + VW <= n; i += VW) {
        const vu idx = (vu){0} + (uint32_t)i + lane;   /* (i wraps past 2^32 elements: still random) */
        const vu keep = (vu)(mix(mix(idx ^ s0) + s1) < th); /* all ones where kept */
        store(dst + i, (vf)((vu)(load(src + i) * sc) & keep));
    }
    if (i < n) { /* the tail through a zero-padded vector */
        float t[VW] = {0};
        memcpy(t, src + i, sizeof(float) * (n - i));
        const vu idx = (vu){0} + (uint32_t)i + lane;
        const vu keep = (vu)(mix(mix(idx ^ s0) + s1) < th);
        store(t, (vf)((vu)(load(t) * sc) & keep));
        memcpy(dst + i, t, sizeof(float) * (n - i));
    }
}
