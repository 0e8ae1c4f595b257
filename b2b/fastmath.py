"""Fast exp, erf/GELU, attention softmax and cross-entropy for MLX on the CPU.

MLX's CPU kernels compute `exp` and `erf` one element at a time (~10 and ~25 ns per element
here, against ~0.2 ns for an add), so softmax, GELU and the vocabulary cross-entropy cost more
than the matrix products around them. The versions below use only multiplies, adds, divides
and selects, which `mx.compile` fuses into vectorised kernels (~2-3 ns per element; each
elementwise block is its own shapeless compiled function, so it is fused in eager code too),
and each has a hand-written gradient, so the backward pass neither differentiates through a
polynomial nor calls the slow ops. Attention is computed in chunks of the batch of at most
B2B_ATTN_CHUNK score elements (default 4M) to keep large score matrices out of mmap, unless
the fused kernel of `cpu_ops` takes it (more than one query; off with B2B_CPU_ATTENTION=0),
which never holds a score matrix.

Accuracy (float32, checked against float64 references in tests/test_fastmath.py):
  exp   (x <= 0 only) relative error < 2e-5 on [-20, 0], < 5e-3 below (where e**x < 2e-9)
  erf   absolute error < 1e-6 (Eigen's rational approximation on [-4, 4]; mx.erf: ~5e-7)
  gelu  absolute error < 2e-6 (torch's own float32 GELU: ~1e-6)
Attention, log-softmax and cross-entropy are the exact formulas evaluated with this exp.

`enabled()` is False off the CPU (Metal/CUDA kernels are fast) and when the environment sets
B2B_FAST_MATH=0, which brings back MLX's own `exp`, `erf`, `softmax` and `logsumexp`.
"""
from __future__ import annotations

import math
import os
from functools import partial

import mlx.core as mx
import mlx.nn as nn

from . import cpu_ops

_SQUARINGS = 7  # exp(x) = exp(x / 128) ** 128: |x / 128| <= 0.68 on the clipped range
_TAYLOR = [1.0 / math.factorial(k) for k in range(7)]  # degree 6: 21 multiply-adds in all
# Eigen's float erf: x * P(x^2) / Q(x^2) on [-4, 4]; erf(4) rounds to 1 in float32. cpu_gelu.c has
# the same coefficients (tests/test_fastmath.py checks they agree).
_ERF_P = (-2.72614225801306e-10, 2.77068142495902e-08, -2.10102402082508e-06, -5.69250639462346e-05,
          -7.34990630326855e-04, -2.95459980854025e-03, -1.60960333262415e-02)
_ERF_Q = (-1.45660718464996e-05, -2.13374055278905e-04, -1.68282697438203e-03, -7.37332916720468e-03,
          -1.42647390514189e-02)
_INV_SQRT2 = 1.0 / math.sqrt(2.0)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)
_CHUNK_ELEMENTS = int(os.environ.get("B2B_ATTN_CHUNK", str(4 * 2**20)))  # score elements per chunk


def enabled() -> bool:
    """True when the default device is the CPU and B2B_FAST_MATH is not "0"."""
    return os.environ.get("B2B_FAST_MATH", "1") != "0" and mx.default_device() == mx.cpu


# -- elementwise -----------------------------------------------------------------------------
def _exp_poly(x: mx.array) -> mx.array:
    """e**x for x <= 0 (every use here subtracts a maximum or a log-normaliser first):
    (degree-6 Taylor polynomial of x / 128) ** 128. Even degree keeps it positive; below -87
    it returns ~1e-38 instead of 0 (the callers mask what must be exactly 0)."""
    y = mx.maximum(x, -87.0) * (1.0 / 2**_SQUARINGS)
    p = _TAYLOR[-1]
    for c in reversed(_TAYLOR[:-1]):
        p = p * y + c
    for _ in range(_SQUARINGS):
        p = p * p
    return p


def _erf(x: mx.array) -> mx.array:
    x = mx.clip(x, -4.0, 4.0)
    x2 = x * x
    p = _ERF_P[0]
    for c in _ERF_P[1:]:
        p = p * x2 + c
    q = _ERF_Q[0]
    for c in _ERF_Q[1:]:
        q = q * x2 + c
    return x * p / q


def _only(primals) -> mx.array:
    """MLX hands a one-input custom function its primals as a tuple or as the array itself."""
    return primals[0] if isinstance(primals, (tuple, list)) else primals


@partial(mx.compile, shapeless=True)
def _gelu_kernel(x: mx.array) -> mx.array:
    return 0.5 * x * (1.0 + _erf(x * _INV_SQRT2))


@partial(mx.compile, shapeless=True)
def _gelu_grad_kernel(x: mx.array, cotangent: mx.array) -> mx.array:
    # Phi(x) as 1 - Phi(-x): not the forward's expression, so mx.compile cannot merge the two
    # and keep the forward's erf alive until the backward pass (a (B, T, F) array per layer).
    cdf = 0.5 - 0.5 * _erf(x * -_INV_SQRT2)
    pdf = _INV_SQRT_2PI * _exp_poly(-0.5 * x * x)
    return cotangent * (cdf + x * pdf)


@mx.custom_function
def _gelu(x: mx.array) -> mx.array:
    return _gelu_kernel(x)


@_gelu.vjp
def _gelu_vjp(primals, cotangent, output):
    return (_gelu_grad_kernel(_only(primals), cotangent),)


def erf(x: mx.array) -> mx.array:
    """erf with a rational approximation (no gradient rule: use it in inference or inside gelu)."""
    return _erf(x) if enabled() else mx.erf(x)


def gelu(x: mx.array) -> mx.array:
    """Exact-form GELU, x * Phi(x), as BERT and transformers' "gelu" define it: the same
    approximation in C (cpu_gelu.c) where the kernel runs, else compiled MLX ops."""
    if not enabled():
        return nn.gelu(x)
    fast = cpu_ops.gelu(x)
    return fast if fast is not None else _gelu(x)


# -- linear ----------------------------------------------------------------------------------
# MLX differentiates x @ W.T into (x^T dy) transposed: each weight's gradient is a column-major
# view, which the C AdamW and gradient norm (cpu_ops) must first copy, strided, every step
# (~50 ms each for minilm). dy^T x computes the same product straight into W's row-major
# layout (the transposes are BLAS flags, not copies).
@mx.custom_function
def _linear(x: mx.array, w: mx.array, b: mx.array) -> mx.array:
    return mx.addmm(b, x, w.T)


def _linear_grads(x: mx.array, w: mx.array, cotangent: mx.array) -> tuple[mx.array, mx.array, mx.array]:
    """dx, dW (row-major) and dy as (N, out) rows (for the bias's gradient)."""
    dy = cotangent.reshape(-1, cotangent.shape[-1])
    return cotangent @ w, dy.T @ x.reshape(-1, x.shape[-1]), dy


@_linear.vjp
def _linear_vjp(primals, cotangent, output):
    dx, dw, dy = _linear_grads(primals[0], primals[1], cotangent)
    return dx, dw, dy.sum(axis=0)


@mx.custom_function
def _linear_no_bias(x: mx.array, w: mx.array) -> mx.array:
    return x @ w.T


@_linear_no_bias.vjp
def _linear_no_bias_vjp(primals, cotangent, output):
    return _linear_grads(primals[0], primals[1], cotangent)[:2]


def linear(x: mx.array, weight: mx.array, bias: mx.array | None = None) -> mx.array:
    """x @ weight.T (+ bias), as nn.Linear, whose weight gradient comes out row-major on the CPU."""
    if not enabled():
        return x @ weight.T if bias is None else mx.addmm(bias, x, weight.T)
    return _linear_no_bias(x, weight) if bias is None else _linear(x, weight, bias)


# -- attention -------------------------------------------------------------------------------
@partial(mx.compile, shapeless=True)
def _masked_exp(s: mx.array, shift: mx.array, mask: mx.array) -> mx.array:
    return mx.where(mask, _exp_poly(s - shift), 0.0)


@mx.custom_function
def _attention(q: mx.array, k: mx.array, v: mx.array, mask: mx.array) -> tuple[mx.array, mx.array]:
    s = q @ k.swapaxes(-1, -2)  # (B, H, Tq, Tk); q is already scaled
    # The row max over all keys, padding included, bounds the real maximum from above: exp
    # cannot overflow, and saves a masked copy of the scores before the reduction.
    m = mx.stop_gradient(s.max(axis=-1, keepdims=True))
    e = _masked_exp(s, m, mask)
    denom = mx.maximum(e.sum(axis=-1, keepdims=True), 1e-30)  # (B, H, Tq, 1)
    out = (e @ v) * (1.0 / denom)  # normalise the (Tq, D) output, not the (Tq, Tk) weights
    return out, m + mx.log(denom)


@_attention.vjp
def _attention_vjp(primals, cotangents, outputs):
    # Flash-attention style: the probabilities are recomputed from the saved log-normaliser,
    # so no (Tq, Tk) matrix is kept between the forward and the backward pass. They are
    # recomputed transposed, (Tk, Tq): the same expression as the forward's would be merged
    # with it by mx.compile, which would then keep the forward's scores alive instead.
    q, k, v, mask = primals
    dout = cotangents[0]
    out, lse = outputs
    mask_t = mask.swapaxes(-1, -2) if mask.ndim >= 2 else mask
    p_t = _masked_exp(k @ q.swapaxes(-1, -2), lse.swapaxes(-1, -2), mask_t)  # (B, H, Tk, Tq)
    dv = p_t @ dout
    delta = (dout * out).sum(axis=-1, keepdims=True).swapaxes(-1, -2)  # sum_k p * dp, (B, H, 1, Tq)
    ds_t = p_t * (v @ dout.swapaxes(-1, -2) - delta)  # (B, H, Tk, Tq)
    return ds_t.swapaxes(-1, -2) @ k, ds_t @ q, dv, mx.zeros_like(mask)


@partial(mx.compile, shapeless=True)
def _scaled_masked_exp(s: mx.array, shift: mx.array, mask: mx.array, scale: float) -> mx.array:
    return mx.where(mask, _exp_poly((s - shift) * scale), 0.0)


@partial(mx.compile, shapeless=True)
def _normalise(out: mx.array, denom: mx.array) -> mx.array:
    return out / mx.maximum(denom, 1e-30)


def _attention_one_query(q: mx.array, k: mx.array, v: mx.array, scale: float, mask: mx.array) -> mx.array:
    """A decoding step's attention (Tq = 1) in six kernels instead of ~ten: the scale folded
    into the exp, no log-normaliser (only a backward pass needs it). A step is dominated by
    MLX's fixed cost per kernel (~5-10 us here), not by arithmetic. Plain ops: MLX
    differentiates it if it must (slower than `_attention`'s rule, but Tq = 1 is inference)."""
    s = q @ k.swapaxes(-1, -2)  # (B, H, 1, Tk), unscaled; scale > 0 keeps the same maximum
    e = _scaled_masked_exp(s, s.max(axis=-1, keepdims=True), mask, scale)
    return _normalise(e @ v, e.sum(axis=-1, keepdims=True))


def attention(q: mx.array, k: mx.array, v: mx.array, scale: float, mask) -> mx.array:
    """Softmax attention (B, H, Tq, D) with a boolean mask (True = may attend), "causal"
    (query i sees keys up to i + Tk - Tq) or None; same contract as
    mx.fast.scaled_dot_product_attention, which it defers to when fast math is off. With more
    than one query, the fused kernel of `cpu_ops` where it applies."""
    if not enabled():
        return mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask=mask)
    Tq, Tk = q.shape[-2], k.shape[-2]
    fused = cpu_ops.attention(q * scale, k, v, mask) if Tq > 1 else None  # None where it does not apply
    if fused is not None:
        return fused
    if isinstance(mask, str):
        mask = mx.arange(Tk)[None, :] <= (mx.arange(Tq)[:, None] + Tk - Tq)  # (Tq, Tk)
    elif mask is None:
        mask = mx.array(True)
    if Tq == 1:
        return _attention_one_query(q, k, v, scale, mask)
    q = q * scale
    B = q.shape[0]
    # Score matrices above glibc's largest heap allocation (32 MB) are mmap'ed afresh and
    # page-faulted on every use; chunks over the batch stay in the heap (and in cache).
    per_row = q.shape[1] * Tq * Tk
    step = max(1, min(B, _CHUNK_ELEMENTS // max(per_row, 1)))
    if step >= B:
        return _attention(q, k, v, mask)[0]
    outs = []
    for b in range(0, B, step):
        m = mask[b : b + step] if mask.ndim == 4 and mask.shape[0] == B else mask
        outs.append(_attention(q[b : b + step], k[b : b + step], v[b : b + step], m)[0])
    return mx.concatenate(outs, axis=0)


@partial(mx.compile, shapeless=True)
def _shifted_exp(x: mx.array, shift: mx.array) -> mx.array:
    return _exp_poly(x - shift)


def log_softmax(x: mx.array) -> mx.array:
    """log-softmax over the last axis (inference: no gradient rule)."""
    if not enabled():
        return x - mx.logsumexp(x, axis=-1, keepdims=True)
    m = x.max(axis=-1, keepdims=True)
    return x - (mx.log(_shifted_exp(x, m).sum(axis=-1, keepdims=True)) + m)


# -- cross-entropy ---------------------------------------------------------------------------
@mx.custom_function
def _cross_entropy(logits: mx.array, labels: mx.array) -> tuple[mx.array, mx.array]:
    m = mx.stop_gradient(logits.max(axis=-1, keepdims=True))
    lse = mx.log(_shifted_exp(logits, m).sum(axis=-1)) + m[:, 0]  # (N,)
    target = mx.take_along_axis(logits, labels[:, None], axis=-1)[:, 0]
    return lse - target, lse


@partial(mx.compile, shapeless=True)
def _cross_entropy_grad(logits, lse, labels, ids, c_nll, c_lse) -> mx.array:
    # d nll / d logits = softmax - onehot, d lse / d logits = softmax: one fused pass over (N, V).
    p = _exp_poly(logits - lse[:, None])
    return (c_nll + c_lse)[:, None] * p - mx.where(ids[None, :] == labels[:, None], c_nll[:, None], 0.0)


@_cross_entropy.vjp
def _cross_entropy_vjp(primals, cotangents, outputs):
    logits, labels = primals
    _, lse = outputs
    c_nll, c_lse = (c if c is not None else mx.zeros_like(lse) for c in cotangents)
    ids = mx.arange(logits.shape[-1], dtype=labels.dtype)
    return _cross_entropy_grad(logits, lse, labels, ids, c_nll, c_lse), mx.zeros_like(labels)


def cross_entropy(logits: mx.array, labels: mx.array) -> tuple[mx.array, mx.array]:
    """Per-row negative log-likelihood and log-normaliser of float32 logits (N, V) for
    integer labels (N,): (nll (N,), logsumexp (N,))."""
    if enabled():
        return _cross_entropy(logits, labels)
    lse = mx.logsumexp(logits, axis=-1)
    return lse - mx.take_along_axis(logits, labels[:, None], axis=-1)[:, 0], lse
