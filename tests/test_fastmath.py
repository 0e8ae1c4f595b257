"""The CPU fast-math kernels: accuracy against float64 references, gradients against MLX's own
ops, the B2B_FAST_MATH=0 opt-out, and compiled (static-cache) decoding against eager decoding."""
import math

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

from b2b import DecodingConfig, fastmath, generate
from b2b.cache import DecoderCache, StaticLayerCache, StepPosition


def _np(a):
    return np.array(a, dtype=np.float64)


def test_exp_accuracy_on_nonpositive_inputs():
    xs = np.linspace(-87, 0, 400_001).astype(np.float32)
    out = _np(mx.compile(fastmath._exp_poly)(mx.array(xs)))
    rel = np.abs(out - np.exp(xs.astype(np.float64))) / np.exp(xs.astype(np.float64))
    assert rel[xs > -20].max() < 2e-5
    assert rel[xs <= -20].max() < 5e-3
    assert float(fastmath._exp_poly(mx.array([-1e30]))[0]) > 0  # clipped, never negative or NaN


def test_erf_and_gelu_accuracy_and_gradient():
    xs = np.linspace(-10, 10, 200_001).astype(np.float32)
    x64 = xs.astype(np.float64)
    erf_ref = np.array([math.erf(v) for v in x64[::50]])
    assert np.abs(_np(fastmath._erf(mx.array(xs[::50]))) - erf_ref).max() < 1e-6
    cdf = 0.5 * (1 + np.array([math.erf(v / math.sqrt(2)) for v in x64[::50]]))
    assert np.abs(_np(fastmath._gelu(mx.array(xs[::50]))) - x64[::50] * cdf).max() < 2e-6
    x = mx.array(xs)
    ours = mx.grad(lambda v: fastmath._gelu(v).sum())(x)
    ref = mx.grad(lambda v: nn.gelu(v).sum())(x)
    assert float(mx.abs(ours - ref).max()) < 1e-5


@pytest.mark.parametrize("mask_kind", ["none", "padding", "causal"])
@pytest.mark.parametrize("chunked,queries", [(False, 6), (True, 6), (False, 1)])
def test_attention_matches_sdpa_with_gradients(mask_kind, chunked, queries, monkeypatch):
    if chunked:  # one batch row per chunk: 4 heads x 6 x 6 scores
        monkeypatch.setattr(fastmath, "_CHUNK_ELEMENTS", 4 * 6 * 6)
    mx.random.seed(4)
    # queries=1 is a decoding step (its own six-kernel path); keys and values stay at 6.
    q = mx.random.normal((3, 4, queries, 8))
    k, v = (mx.random.normal((3, 4, 6, 8)) for _ in range(2))
    cot = mx.random.normal((3, 4, queries, 8))
    mask = {"none": None, "causal": "causal",
            "padding": mx.array([[1] * 6, [1] * 4 + [0] * 2, [1] * 2 + [0] * 4]).astype(mx.bool_)[:, None, None, :]}[mask_kind]
    ours = lambda q, k, v: fastmath.attention(q, k, v, 0.3, mask)
    ref = lambda q, k, v: mx.fast.scaled_dot_product_attention(q, k, v, scale=0.3, mask=mask)
    assert float(mx.abs(ours(q, k, v) - ref(q, k, v)).max()) < 1e-5
    g_ours = mx.compile(lambda q, k, v, c: mx.vjp(ours, [q, k, v], [c])[1])(q, k, v, cot)
    g_ref = mx.vjp(ref, [q, k, v], [cot])[1]
    for a, b in zip(g_ours, g_ref):
        assert float(mx.abs(a - b).max()) < 2e-5


def test_cross_entropy_and_log_softmax():
    mx.random.seed(5)
    logits = mx.random.normal((5, 50)) * 4
    labels = mx.array([0, 7, 49, 3, 3])
    c_nll, c_lse = mx.random.normal((5,)), mx.random.normal((5,))

    def ref(x):
        lse = mx.logsumexp(x, axis=-1)
        return lse - mx.take_along_axis(x, labels[:, None], axis=-1)[:, 0], lse

    for a, b in zip(fastmath.cross_entropy(logits, labels), ref(logits)):
        assert float(mx.abs(a - b).max()) < 1e-5
    g_ours = mx.vjp(lambda x: fastmath.cross_entropy(x, labels), [logits], [c_nll, c_lse])[1][0]
    g_ref = mx.vjp(ref, [logits], [c_nll, c_lse])[1][0]
    assert float(mx.abs(g_ours - g_ref).max()) < 1e-5
    expected = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    assert float(mx.abs(fastmath.log_softmax(logits) - expected).max()) < 1e-5


def test_opt_out_uses_mlx_ops(monkeypatch):
    x = mx.random.normal((64,)) * 3
    monkeypatch.setenv("B2B_FAST_MATH", "0")
    assert not fastmath.enabled()
    assert mx.array_equal(fastmath.gelu(x), nn.gelu(x))
    monkeypatch.setenv("B2B_FAST_MATH", "1")
    assert fastmath.enabled()  # the tests run on the CPU


def test_static_cache_step_matches_growing_cache(tiny_model):
    src = mx.array([[101, 2000, 2001, 2002, 102, 0], [101, 2003, 2004, 2005, 2006, 102]])
    mask = (src > 0).astype(mx.int32)
    tgt = mx.array([[101, 2010, 2011, 2012], [101, 2014, 2015, 2016]])
    memory = tiny_model.encode(src, mask)
    grow = tiny_model.make_cache(memory, mask)
    c = tiny_model.config
    shape = (2, c.num_heads, 8, c.head_dim)
    keys = [mx.zeros(shape) for _ in grow.layers]
    values = [mx.zeros(shape) for _ in grow.layers]
    for t in range(tgt.shape[1]):
        expected = tiny_model.decode_step(tgt[:, t : t + 1], grow)
        at = StepPosition(mx.array(t, mx.int32), shape[2])
        layers = [StaticLayerCache(g.cross_kv, k, v, at) for g, k, v in zip(grow.layers, keys, values)]
        got = tiny_model.decode_step(tgt[:, t : t + 1], DecoderCache(layers, grow.cross_mask))
        keys, values = [layer.keys for layer in layers], [layer.values for layer in layers]
        assert np.allclose(np.array(got), np.array(expected), atol=1e-4)


@pytest.mark.parametrize("beams", [1, 3])
def test_compiled_decoding_matches_eager(tiny_model, beams, monkeypatch):
    src = mx.array([[101, 2000, 2001, 2002, 2003, 102, 0, 0], [101, 2004, 2005, 2006, 2007, 2008, 2009, 102]])
    mask = (src > 0).astype(mx.int32)
    cfg = DecodingConfig(max_length=12, num_beams=beams, no_repeat_ngram_size=0)
    compiled = generate(tiny_model, src, mask, cfg)
    monkeypatch.setenv("B2B_COMPILE_DECODE", "0")
    eager = generate(tiny_model, src, mask, cfg)
    assert [h.tokens for h in compiled] == [h.tokens for h in eager]


@pytest.mark.parametrize("bias", [True, False])
def test_linear_matches_nn_linear_and_its_weight_gradient_is_row_major(bias):
    """b2b's Linear: nn.Linear's output and gradients; the weight's gradient in the weight's own
    row-major layout on the CPU (MLX's is a transposed view, which the C AdamW must copy)."""
    from b2b.layers import Linear

    mx.random.seed(4)
    fast, plain = Linear(8, 3, bias=bias), nn.Linear(8, 3, bias=bias)
    plain.update(fast.parameters())
    x, c = mx.random.normal((2, 5, 8)), mx.random.normal((2, 5, 3))

    def loss(m, x):
        return (m(x) * c).sum()

    (v1, g1), (v2, g2) = (nn.value_and_grad(m, loss)(m, x) for m in (fast, plain))
    assert float(mx.abs(v1 - v2)) < 1e-5
    for name in g2:
        assert float(mx.abs(g1[name] - g2[name]).max()) < 1e-5, name
    dx1, dx2 = (mx.grad(lambda x, m=m: loss(m, x))(x) for m in (fast, plain))
    assert float(mx.abs(dx1 - dx2).max()) < 1e-5
    assert np.array(g1["weight"], copy=False).flags["C_CONTIGUOUS"] == fastmath.enabled()


def test_the_c_gelu_kernel_uses_fastmaths_erf_coefficients():
    """The erf approximation is written twice (fastmath.py for MLX ops, cpu_gelu.c for the
    kernel): the two must not drift apart."""
    import re
    from pathlib import Path

    source = (Path(fastmath.__file__).parent / "cpu_gelu.c").read_text()
    for name, want in (("erf_p", fastmath._ERF_P), ("erf_q", fastmath._ERF_Q)):
        body = re.search(rf"{name}\[\d+\] = \{{([^}}]*)\}}", source).group(1)
        assert tuple(float(c.strip().rstrip("f")) for c in body.split(",")) == want, name
