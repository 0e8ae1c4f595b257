"""b2b's CPU primitives under mx.vmap and mx.jvp (MLX's own ops are the reference): a model
vmapped over a batch of inputs gives each input's own output, with the kernels in use."""
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


def test_a_vmapped_model_gives_each_input_its_own_output(monkeypatch):
    mx.random.seed(0)
    model = Bert2Bert(B2BConfig.preset("tiny", dropout=0.0))
    model.eval()
    rng = np.random.default_rng(0)
    src = mx.array(rng.integers(5, 120, size=(3, 2, 32)))
    src_mask = mx.array((np.arange(32)[None, None, :] < rng.integers(8, 33, size=(3, 2, 1))).astype(np.int32))
    tgt = mx.array(rng.integers(5, 120, size=(3, 2, 6)))
    calls = {name: [] for name in ("attention", "layer_norm", "gelu")}
    for name, seen in calls.items():
        real = getattr(cpu_ops, name)
        monkeypatch.setattr(cpu_ops, name, lambda *a, real=real, seen=seen: seen.append(1) or real(*a))
    mapped = mx.vmap(model)(src, src_mask, tgt)  # (3, 2, 6, V)
    assert all(calls.values()), {k: len(v) for k, v in calls.items()}  # the kernels ran under vmap
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
