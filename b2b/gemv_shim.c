/* cblas_sgemm with products of a few rows (at most max_rows) sent to cblas_sgemv, row by row.
 *
 * Why: MLX's CPU matmul always calls cblas_sgemm. For a decoding step (one row of
 * activations times a weight matrix) OpenBLAS 0.3.21's sgemm first packs the whole weight
 * matrix into a scratch buffer, which costs more than the product itself; sgemv reads the
 * matrix once. b2b.runtime compiles this file, loads it with RTLD_GLOBAL *before* the real
 * BLAS (so MLX's cblas_sgemm resolves here) and hands it the real functions with
 * b2b_gemv_shim_init. Everything else (larger products, every other BLAS symbol) goes to
 * the real library unchanged. MLX calls it row-major only; other layouts pass through.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef void (*sgemm_fn)(int, int, int, int, int, int, float, const float *, int, const float *, int, float,
                         float *, int);
typedef void (*sgemv_fn)(int, int, int, int, float, const float *, int, const float *, int, float, float *, int);

enum { ROW_MAJOR = 101, NO_TRANS = 111, TRANS = 112 };

static sgemm_fn real_sgemm;
static sgemv_fn real_sgemv;
static int max_rows = 4;

void b2b_gemv_shim_init(void *sgemm, void *sgemv, int rows) {
    real_sgemm = (sgemm_fn)sgemm;
    real_sgemv = (sgemv_fn)sgemv;
    max_rows = rows;
}

void cblas_sgemm(int order, int trans_a, int trans_b, int M, int N, int K, float alpha, const float *A, int lda,
                 const float *B, int ldb, float beta, float *C, int ldc) {
    if (!real_sgemm) {
        fprintf(stderr, "b2b gemv shim: cblas_sgemm called before b2b_gemv_shim_init\n");
        abort();
    }
    if (order != ROW_MAJOR || M > max_rows || K == 0) {
        real_sgemm(order, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        return;
    }
    for (int i = 0; i < M; i++) {
        /* Row i of op(A) (1 x K): contiguous when A is not transposed, a column of A (K x M) otherwise. */
        const float *x = trans_a == NO_TRANS ? A + (long)i * lda : A + i;
        int incx = trans_a == NO_TRANS ? 1 : lda;
        float *y = C + (long)i * ldc;
        if (beta == 0.0f) /* C may hold garbage (NaN): sgemm ignores it then, and so must we */
            memset(y, 0, sizeof(float) * (size_t)N);
        if (trans_b == NO_TRANS) /* op(B) = B, K x N: y = B^T x */
            real_sgemv(ROW_MAJOR, TRANS, K, N, alpha, B, ldb, x, incx, beta, y, 1);
        else /* op(B) = B^T with B N x K: y = B x */
            real_sgemv(ROW_MAJOR, NO_TRANS, N, K, alpha, B, ldb, x, incx, beta, y, 1);
    }
}
