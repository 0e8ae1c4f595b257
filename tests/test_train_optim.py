"""train/optim.py: AdamW through b2b's C kernel (cpu_ops.adamw) against mlx.optimizers.AdamW
with optim.clip_grad_norm (schedule, bias correction, clipping on and off, a MultiOptimizer),
in-place updates that never touch an array someone still holds, and MLX's path where the
kernel steps aside."""
import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np
import pytest
from mlx.utils import tree_flatten, tree_map

from b2b import cpu_ops
from train.optim import AdamW, global_norm, make_update

needs_kernel = pytest.mark.skipif(not cpu_ops.enabled("adamw"), reason="b2b's CPU kernels not built here")


def _model(dtype=mx.float32):
    mx.random.seed(0)
    model = nn.Sequential(nn.Linear(33, 70), nn.Linear(70, 5))
    model.set_dtype(dtype)
    return model


def _grads(model, rng):
    return tree_map(lambda p: mx.array(rng.standard_normal(p.shape).astype(np.float32)).astype(p.dtype), model.parameters())


def _max_diff(a, b) -> float:
    return max(float(mx.abs(x - y).max()) for (_, x), (_, y) in zip(tree_flatten(a), tree_flatten(b)))


def _run_both(make_mlx, make_ours, clip: float, steps: int = 4, dtype=mx.float32):
    rng = np.random.default_rng(0)
    ref, ours = _model(dtype), _model(dtype)
    o_ref, o_ours = make_mlx(), make_ours()
    update = make_update(ours, o_ours, clip)
    for _ in range(steps):
        grads = _grads(ref, rng)
        clipped = optim.clip_grad_norm(grads, clip)[0] if clip > 0 else grads
        o_ref.update(ref, clipped)
        update(grads, global_norm(grads))
        mx.eval(ref.parameters(), o_ref.state, ours.parameters(), o_ours.state)
    return ref, ours, o_ref, o_ours


@pytest.mark.parametrize("bias_correction", [False, True])
@pytest.mark.parametrize("clip", [0.0, 0.5])
def test_matches_mlx_adamw(bias_correction, clip):
    def make(cls):
        return lambda: cls(learning_rate=optim.linear_schedule(1e-2, 1e-3, 5), weight_decay=0.05,
                           bias_correction=bias_correction)

    ref, ours, o_ref, o_ours = _run_both(make(optim.AdamW), make(AdamW), clip)
    assert o_ours.step.item() == 4
    assert _max_diff(ref.parameters(), ours.parameters()) < 1e-6
    assert _max_diff(o_ref.state, o_ours.state) < 1e-6


def test_multi_optimizer_gets_the_scale():
    def make(cls):
        return lambda: optim.MultiOptimizer([cls(learning_rate=3e-2), cls(learning_rate=1e-2)],
                                            [lambda path, _: path.startswith("layers.0")])

    ref, ours, _, _ = _run_both(make(optim.AdamW), make(AdamW), 0.5)
    assert _max_diff(ref.parameters(), ours.parameters()) < 1e-6


def _stepper(clip: float):
    """A model, its AdamW and `step()`: one update with the same gradients, evaluated."""
    model, opt = _model(), AdamW(learning_rate=1e-1)
    update = make_update(model, opt, clip)
    grads = _grads(model, np.random.default_rng(0))

    def step():
        update(grads, global_norm(grads))
        mx.eval(model.parameters(), opt.state)

    step()
    return model, opt, step


@needs_kernel
def test_arrays_still_held_are_not_overwritten():
    """The kernel updates in place only the buffers nobody else holds."""
    model, opt, step = _stepper(0.0)
    held_w, held_m = model.layers[0].weight, opt.state["layers"][0]["weight"]["m"]
    before_w, before_m = np.array(held_w), np.array(held_m)
    step()
    assert np.array_equal(np.array(held_w), before_w) and np.array_equal(np.array(held_m), before_m)
    assert not np.array_equal(np.array(model.layers[0].weight), before_w)


def _address(a: mx.array) -> int:
    return np.asarray(memoryview(a)).ctypes.data  # (the view is dropped at once)


@needs_kernel
def test_updates_in_place_when_nothing_else_holds_the_arrays():
    """Parameters and moments keep their buffers from step to step (no fresh pages each step)."""
    model, opt, step = _stepper(1.0)

    def where():
        return _address(model.layers[0].weight), _address(opt.state["layers"][0]["weight"]["v"])

    before = where()
    step()
    assert where() == before


@needs_kernel
def test_the_kernel_runs_and_steps_aside(monkeypatch):
    calls = []
    real = cpu_ops.adamw
    monkeypatch.setattr(cpu_ops, "adamw", lambda *a: calls.append(1) or real(*a))
    _run_both(lambda: optim.AdamW(1e-2), lambda: AdamW(1e-2), 0.5, steps=1)
    assert len(calls) == 4  # two weights, two biases
    args = [mx.zeros(2, mx.float16)] * 4 + [mx.zeros(4), (0.9, 0.1, 0.999, 0.001, 1e-8)]
    assert real(*args) is None  # float16: MLX's update
    ref, ours, _, _ = _run_both(lambda: optim.AdamW(1e-2), lambda: AdamW(1e-2), 0.0, steps=2, dtype=mx.float16)
    for (_, a), (_, b) in zip(tree_flatten(ref.parameters()), tree_flatten(ours.parameters())):
        np.testing.assert_array_equal(np.array(a), np.array(b))  # the same ops (NaN where eps underflows)
    monkeypatch.setenv("B2B_CPU_ADAMW", "0")
    assert real(*[mx.zeros(2)] * 4, mx.zeros(4), (0.9, 0.1, 0.999, 0.001, 1e-8)) is None


@pytest.mark.parametrize("kernel", ["1", "0"])
def test_global_norm(monkeypatch, kernel):
    monkeypatch.setenv("B2B_CPU_ADAMW", kernel)
    rng = np.random.default_rng(1)
    parts = [rng.standard_normal(s).astype(np.float32) for s in ((1000, 37), (5,), (3, 3), (70000,))]
    grads = {"a": mx.array(parts[0]), "b": [mx.array(parts[1]), {"c": mx.array(parts[2])}], "d": mx.array(parts[3])}
    want = np.sqrt(sum((p.astype(np.float64) ** 2).sum() for p in parts))
    for fn in (global_norm, mx.compile(global_norm)):
        assert abs(fn(grads).item() - want) <= 1e-5 * want
    assert (cpu_ops.sum_squares([grads["a"]]) is None) == (kernel == "0" or not cpu_ops.enabled("adamw"))
