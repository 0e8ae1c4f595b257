"""The optimizer update of the training loop (and of the bench's b2b side): AdamW with gradient
clipping, compiled.

`AdamW` is mlx.optimizers.AdamW (same state, schedule, checkpoints and maths) whose update of
each parameter runs, on the CPU, as one C kernel (b2b.cpu_ops.adamw: MLX's compiled AdamW
kernel computes square roots and divisions one element at a time, ~0.25 s of a minilm step on
one core) with the clipping scale folded in. Elsewhere, or with B2B_CPU_ADAMW=0, MLX's own
update runs."""
from __future__ import annotations

from functools import partial
from typing import Callable

import mlx.core as mx
import mlx.optimizers as optim
from mlx.utils import tree_flatten, tree_map, tree_reduce

from b2b import Bert2Bert, cpu_ops


class AdamW(optim.AdamW):
    """mlx.optimizers.AdamW; set `grad_scale` (an array) to multiply the gradients first."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.grad_scale: mx.array | None = None
        self._coef: mx.array | None = None

    def apply_gradients(self, gradients: dict, parameters: dict) -> dict:
        self._coef = None  # this step's: the learning rate and step change in the call below
        try:
            return super().apply_gradients(gradients, parameters)
        finally:
            self._coef = None

    def _coefficients(self) -> mx.array:
        """(scale, decay, c1, c2) of cpu_adamw.c for this step, as MLX's AdamW computes them."""
        lr = self.learning_rate.astype(mx.float32)
        one = mx.array(1.0, dtype=mx.float32)
        scale = one if self.grad_scale is None else self.grad_scale.astype(mx.float32)
        decay = 1 - lr * self.weight_decay
        c1, c2 = lr, one
        if self.bias_correction:
            b1, b2 = self.betas
            c1, c2 = lr / (1 - b1**self.step), mx.rsqrt(1 - b2**self.step)
        return mx.stack([scale, decay, c1.astype(mx.float32), c2.astype(mx.float32)])

    def apply_single(self, gradient: mx.array, parameter: mx.array, state: dict) -> mx.array:
        if self._coef is None:
            self._coef = self._coefficients()
        b1, b2 = self.betas
        out = cpu_ops.adamw(parameter, gradient, state["m"], state["v"], self._coef, (b1, 1 - b1, b2, 1 - b2, self.eps))
        if out is None:  # MLX's update (on a GPU, or for another dtype)
            if self.grad_scale is not None:
                gradient = gradient * self.grad_scale  # (float32: as clip_grad_norm's product)
            return super().apply_single(gradient, parameter, state)
        parameter, state["m"], state["v"] = out
        return parameter


def _set_grad_scale(optimizer: optim.Optimizer, scale: mx.array | None) -> bool:
    """Hand the clipping scale to every AdamW of `optimizer`; False if some cannot take it."""
    parts = optimizer.optimizers if isinstance(optimizer, optim.MultiOptimizer) else [optimizer]
    if not all(isinstance(o, AdamW) for o in parts):
        return False
    for o in parts:
        o.grad_scale = scale
    return True


def global_norm(grads) -> mx.array:
    """The L2 norm of all gradients together, in float32 (on the CPU one C kernel over all of
    them, summing in double; MLX's reductions run one element at a time)."""
    squares = cpu_ops.sum_squares([g for _, g in tree_flatten(grads)])
    if squares is None:
        squares = tree_reduce(lambda acc, g: acc + g.astype(mx.float32).square().sum(), grads, mx.array(0.0))
    return mx.sqrt(squares)


def make_update(model: Bert2Bert, optimizer: optim.Optimizer, clip_norm: float) -> Callable[[dict, mx.array], None]:
    """`update(grads, norm)`, compiled: the gradients scaled down to `clip_norm` when their
    global norm (computed by the caller, who checks it is finite) is above it (as
    optim.clip_grad_norm; 0: no clipping), then one optimizer step. Evaluate
    model.parameters() and optimizer.state after it."""
    state = [model.state, optimizer.state, mx.random.state]

    @partial(mx.compile, inputs=state, outputs=state)
    def update(grads: dict, norm: mx.array) -> None:
        scale = mx.minimum(clip_norm / (norm + 1e-6), 1.0) if clip_norm > 0 else None
        if scale is not None and not _set_grad_scale(optimizer, scale):
            grads = tree_map(lambda g: g * scale, grads)
        try:
            optimizer.update(model, grads)
        finally:
            _set_grad_scale(optimizer, None)

    return update
