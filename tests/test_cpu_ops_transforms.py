"""b2b's CPU primitives under mx.vmap and mx.jvp (MLX's own ops are the reference): a model
vmapped over a batch of inputs gives each input's own output, and forward-mode derivatives
match MLX's own, with the kernels in use."""
import mlx.core as mx
import numpy as np
import pytest

from b2b import B2BConfig, Bert2Bert, cpu_ops, fastmath

pytestmark = pytest.mark.skipif(not cpu_ops.enabled(),
                                reason="b2b's CPU kernels not built here (needs cmake, nanobind, a C++ compiler)")


def _close(a, b, tol=1e-5):
    assert a.shape == b.shape, (a.shape, b.shape)
    assert float(mx.abs(a - b).max()) <= tol * (float(mx.abs(b).max()) + 1e-9)


def _exact_gelu(x):
    return 0.5 * x * (1.0 + mx.erf(x * (1.0 / np.sqrt(2.0))))


def _mlx_layer_norm(x, w, b, eps=1e-12):
    mean = x.mean(-1, keepdims=True)
    return (x - mean) * mx.rsqrt(x.var(-1, keepdims=True) + eps) * w + b


def _count_kernel_outputs(monkeypatch) -> dict[str, int]:
    """How many times each of the model's kernels computed something (not None: applied)."""
    calls = dict.fromkeys(("attention", "layer_norm", "gelu"), 0)
    for name in calls:
        def counted(*args, real=getattr(cpu_ops, name), name=name):
            out = real(*args)
            calls[name] += out is not None
            return out
        monkeypatch.setattr(cpu_ops, name, counted)
    return calls


def test_a_vmapped_model_gives_each_input_its_own_output(monkeypatch):
    mx.random.seed(0)
    model = Bert2Bert(B2BConfig.preset("tiny", num_heads=2, dropout=0.0))  # head size 16, as the attention kernel needs
    model.eval()
    rng = np.random.default_rng(0)
    src = mx.array(rng.integers(5, 120, size=(3, 2, 32)))
    src_mask = mx.array((np.arange(32)[None, None, :] < rng.integers(8, 33, size=(3, 2, 1))).astype(np.int32))
    tgt = mx.array(rng.integers(5, 120, size=(3, 2, 6)))
    calls = _count_kernel_outputs(monkeypatch)
    mapped = mx.vmap(model)(src, src_mask, tgt)  # (3, 2, 6, V)
    assert all(calls.values()), calls  # the kernels ran under vmap
    for i in range(3):
        _close(mapped[i], model(src[i], src_mask[i], tgt[i]))


@pytest.mark.parametrize("q_axis, kv_axis, mask_axis", [(0, 0, 0), (2, None, None), (0, 1, None), (None, 0, 0)])
def test_attention_vmaps_over_any_axis_of_its_inputs(q_axis, kv_axis, mask_axis):
    mx.random.seed(1)
    V, B, H, Tq, Tk, D = 3, 2, 2, 5, 7, 16

    def mapped(shape, axis):
        return mx.random.normal(shape) if axis is None else mx.random.normal(shape[:axis] + (V,) + shape[axis:])

    q, k, v = mapped((B, H, Tq, D), q_axis), mapped((B, H, Tk, D), kv_axis), mapped((B, H, Tk, D), kv_axis)
    lengths = np.random.default_rng(1).integers(1, Tk + 1, size=(V, B))
    mask = mx.array(np.arange(Tk) < lengths[..., None])[:, :, None, None, :]  # (V, B, 1, 1, Tk)
    if mask_axis is None:
        mask = mask[0]

    def attend(q, k, v, m):
        out = cpu_ops.attention(q, k, v, m)
        assert out is not None  # the kernel, not the MLX fallback
        return out

    got = mx.vmap(attend, in_axes=(q_axis, kv_axis, kv_axis, mask_axis))(q, k, v, mask)
    pick = lambda a, axis, i: a if axis is None else mx.take(a, i, axis=axis)  # noqa: E731
    for i in range(V):
        want, _ = fastmath._attention(pick(q, q_axis, i), pick(k, kv_axis, i), pick(v, kv_axis, i), pick(mask, mask_axis, i))
        _close(got[i], want)


@pytest.mark.parametrize("x_axis, w_axis", [(0, None), (-1, None), (1, 0), (None, 1)])
def test_layer_norm_vmaps_over_its_input_or_an_ensemble_of_weights(x_axis, w_axis):
    mx.random.seed(2)
    V, C = 3, 24
    x_shape = [4, 5, C]
    if x_axis is not None:
        x_shape.insert(x_axis % 4 if x_axis < 0 else x_axis, V)
    x = mx.random.normal(tuple(x_shape)) * 2 + 1
    w_shape = (C,) if w_axis is None else ((V, C) if w_axis == 0 else (C, V))
    w, b = mx.random.normal(w_shape), mx.random.normal(w_shape)
    got = mx.vmap(lambda x, w, b: cpu_ops.layer_norm(x, w, b, 1e-12), in_axes=(x_axis, w_axis, w_axis))(x, w, b)
    pick = lambda a, axis, i: a if axis is None else mx.take(a, i, axis=axis)  # noqa: E731
    for i in range(V):
        _close(got[i], _mlx_layer_norm(pick(x, x_axis, i), pick(w, w_axis, i), pick(b, w_axis, i)), 1e-4)


def test_gelu_and_dropout_vmap_elementwise():
    mx.random.seed(3)
    x = mx.random.normal((4, 3, 40)) * 3
    _close(mx.vmap(cpu_ops.gelu, in_axes=1)(x), mx.moveaxis(_exact_gelu(x), 1, 0), 5e-6)
    y = mx.vmap(lambda x: cpu_ops.dropout(x, 0.5), in_axes=2)(x + 10)  # (40, 4, 3)
    kept = np.array(y != 0)
    assert 0.35 < kept.mean() < 0.65 and not (kept == kept[:1]).all()  # each example its own mask
    _close(mx.where(y != 0, y, 0), mx.where(y != 0, 2 * mx.moveaxis(x + 10, 2, 0), 0))


def test_gelu_and_dropout_jvp_match_their_derivatives():
    mx.random.seed(4)
    x, t = mx.random.normal((5, 33)) * 3, mx.random.normal((5, 33))
    (_,), (got,) = mx.jvp(cpu_ops.gelu, [x], [t])
    (_,), (want,) = mx.jvp(_exact_gelu, [x], [t])
    _close(got, want)
    mx.random.seed(7)
    (y,), (dy,) = mx.jvp(lambda x: cpu_ops.dropout(x, 0.25), [x + 10], [t])
    _close(dy, mx.where(y != 0, t / 0.75, 0.0))  # the same mask and scale as the output


def _mlx_attention(q, k, v, key_mask, causal):
    """Plain softmax attention with MLX ops (mx.jvp differentiates it): the kernel's contract,
    a row with no key to attend gives zeros."""
    Tq, Tk = q.shape[2], k.shape[2]
    allowed = mx.ones((1, 1, Tq, Tk), dtype=mx.bool_)
    if key_mask is not None:
        allowed = allowed & key_mask
    if causal:
        allowed = allowed & (mx.arange(Tk)[None, :] <= mx.arange(Tk - Tq, Tk)[:, None])
    s = mx.where(allowed, q @ k.swapaxes(-1, -2), -1e30)
    p = mx.where(allowed, mx.softmax(s, axis=-1, precise=True), 0.0)
    return p @ v


@pytest.mark.parametrize("mask", ["keys", "causal", None])
def test_attention_jvp_matches_mlx_ops(mask):
    mx.random.seed(5)
    B, H, Tq, Tk, D = 2, 3, 4, 6, 16
    q, k, v = mx.random.normal((B, H, Tq, D)), mx.random.normal((B, H, Tk, D)), mx.random.normal((B, H, Tk, D))
    tq, tk, tv = mx.random.normal(q.shape), mx.random.normal(k.shape), mx.random.normal(v.shape)
    key_mask = mx.array(np.arange(Tk) < np.array([3, 6])[:, None])[:, None, None, :] if mask == "keys" else None
    kernel_mask = key_mask if mask == "keys" else mask

    def kernel(q, k, v):
        out = cpu_ops.attention(q, k, v, kernel_mask)
        assert out is not None  # the kernel, not the MLX fallback
        return out

    for tangents in ([tq, tk, tv], [tq, 0 * tk, 0 * tv], [0 * tq, 0 * tk, tv]):
        (out,), (got,) = mx.jvp(kernel, [q, k, v], tangents)
        (want_out,), (want,) = mx.jvp(lambda q, k, v: _mlx_attention(q, k, v, key_mask, mask == "causal"), [q, k, v],
                                      tangents)
        _close(out, want_out)
        _close(got, want, 1e-4)
    # Only some inputs carry a tangent: the others are constants, as mx.jvp over a closure has them.
    (_,), (got,) = mx.jvp(lambda v: kernel(q, k, v), [v], [tv])
    (_,), (want,) = mx.jvp(lambda v: _mlx_attention(q, k, v, key_mask, mask == "causal"), [v], [tv])
    _close(got, want, 1e-4)


def test_layer_norm_jvp_matches_mlx_ops():
    mx.random.seed(6)
    C = 24
    x, w, b = mx.random.normal((3, 5, C)) * 2 + 1, mx.random.normal((C,)), mx.random.normal((C,))
    tx, tw, tb = mx.random.normal(x.shape), mx.random.normal(w.shape), mx.random.normal(b.shape)
    kernel = lambda x, w, b: cpu_ops.layer_norm(x, w, b, 1e-12)  # noqa: E731
    for tangents in ([tx, tw, tb], [tx, 0 * tw, 0 * tb], [0 * tx, tw, 0 * tb]):
        (y,), (got,) = mx.jvp(kernel, [x, w, b], tangents)
        (want_y,), (want,) = mx.jvp(_mlx_layer_norm, [x, w, b], tangents)
        _close(y, want_y, 1e-4)
        _close(got, want, 1e-4)
    (_,), (got,) = mx.jvp(lambda x: kernel(x, w, b), [x], [tx])
    (_,), (want,) = mx.jvp(lambda x: _mlx_layer_norm(x, w, b), [x], [tx])
    _close(got, want, 1e-4)


def test_a_model_jvp_matches_mlx_ops(monkeypatch):
    """Forward mode through the whole model (attention, LayerNorm, GELU kernels): the derivative
    of the logits along a direction in the word embeddings, against the same with fast math off
    (MLX's own ops)."""
    mx.random.seed(8)
    model = Bert2Bert(B2BConfig.preset("tiny", num_heads=2, dropout=0.0))  # head size 16, as the attention kernel needs
    model.eval()
    rng = np.random.default_rng(8)
    src = mx.array(rng.integers(5, 120, size=(2, 32)))
    src_mask = mx.array((np.arange(32)[None, :] < np.array([[20], [32]])).astype(np.int32))
    tgt = mx.array(rng.integers(5, 120, size=(2, 6)))
    table = model.encoder.embeddings.word.weight
    direction = mx.random.normal(table.shape)
    calls = _count_kernel_outputs(monkeypatch)

    def logits(weight):
        model.encoder.embeddings.word.update({"weight": weight})
        return model(src, src_mask, tgt)

    (_,), (got,) = mx.jvp(logits, [table], [direction])
    assert all(calls.values()), calls  # the kernels ran
    monkeypatch.setenv("B2B_FAST_MATH", "0")
    monkeypatch.setenv("B2B_CPU_LAYERNORM", "0")
    calls.update(dict.fromkeys(calls, 0))
    (_,), (want,) = mx.jvp(logits, [table], [direction])
    assert not any(calls.values()), calls  # and now did not
    logits(table)
    _close(got, want, 1e-3)
