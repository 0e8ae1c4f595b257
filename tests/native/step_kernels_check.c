/* Checks cpu_step.c's products, float32 and float16 weights, and its softmax against a double
 * reference; built by tests/test_native_arch.py for this CPU and, under qemu, for aarch64 (the
 * ARM __fp16 branch, which no x86 build compiles). Prints what it found; exits 1 on a mismatch. */
#include "../../b2b/cpu_step.c"
#include <stdio.h>

static int check_linear(int R, int in, int out, int act) {
    float *x = malloc(sizeof(float) * R * in), *W = malloc(sizeof(float) * out * in), *b = malloc(sizeof(float) * out);
    float *y32 = malloc(sizeof(float) * R * out), *y16 = malloc(sizeof(float) * R * out);
    hf *Wh = malloc(sizeof(hf) * out * in);
    for (int i = 0; i < R * in; i++) x[i] = rand() / (float)RAND_MAX - 0.5f;
    for (int i = 0; i < out * in; i++) W[i] = rand() / (float)RAND_MAX - 0.5f;
    for (int i = 0; i < out; i++) b[i] = rand() / (float)RAND_MAX;
    int ok = 1;
    if (HALF) {
        ok &= b2b_to_half(W, Wh, (long)out * in) == 0; /* random floats do not survive float16 */
        for (int i = 0; i < out * in; i++) W[i] = half_to_float(Wh[i]);
        ok &= b2b_to_half(W, Wh, (long)out * in) == 1; /* these do */
    }
    linear(x, R, in, out, W, NULL, b, y32, act);
    linear(x, R, in, out, W, HALF ? Wh : NULL, b, y16, act);
    double worst = 0;
    for (int r = 0; r < R; r++)
        for (int o = 0; o < out; o++) {
            double s = b[o];
            for (int i = 0; i < in; i++) s += (double)x[r * in + i] * W[o * in + i];
            if (act) s = 0.5 * s * (1 + erf(s / sqrt(2.0)));
            double e32 = fabs(y32[r * out + o] - s), e16 = fabs(y16[r * out + o] - s);
            worst = fmax(worst, fmax(e32, e16));
        }
    ok &= worst < 1e-5;
    printf("linear R=%d in=%d out=%d act=%d: max error %.1e %s\n", R, in, out, act, worst, ok ? "ok" : "FAIL");
    free(x), free(W), free(b), free(y32), free(y16), free(Wh);
    return ok;
}

static int check_softmax(int n) {
    float *s = malloc(sizeof(float) * n);
    double *e = malloc(sizeof(double) * n), total = 0, worst = 0;
    for (int i = 0; i < n; i++) {
        s[i] = 20.0f * rand() / (float)RAND_MAX - 10.0f;
        e[i] = exp(s[i]);
        total += e[i];
    }
    softmax_row(s, n);
    for (int i = 0; i < n; i++)
        if (fabs(s[i] - e[i] / total) > worst) worst = fabs(s[i] - e[i] / total);
    int ok = worst < 1e-6;
    printf("softmax n=%d: max error %.1e %s\n", n, worst, ok ? "ok" : "FAIL");
    free(s), free(e);
    return ok;
}

int main(void) {
    srand(1);
    printf("vector width %d floats, float16 weights %s\n", VW, HALF ? "yes" : "no");
    int ok = 1;
    /* Shapes that exercise the 4x4 register tile, the single-row tile and the partial last block. */
    int shapes[][3] = {{1, 64, 8}, {5, 70, 37}, {8, 384, 52}, {3, 17, 3}};
    for (int k = 0; k < 4; k++)
        for (int act = 0; act < 2; act++) ok &= check_linear(shapes[k][0], shapes[k][1], shapes[k][2], act);
    ok &= check_softmax(7) & check_softmax(301);
    return ok ? 0 : 1;
}
