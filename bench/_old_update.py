"""The training update as train/loop.py did it before train/optim.py existed (MLX's AdamW,
clipping by a compiled scale), for `bench.ablate --baseline` runs of older code only."""
from functools import partial

import mlx.core as mx
from mlx.optimizers import AdamW
from mlx.utils import tree_map, tree_reduce

__all__ = ["AdamW", "global_norm", "make_update"]


def global_norm(grads) -> mx.array:
    return mx.sqrt(tree_reduce(lambda acc, g: acc + g.astype(mx.float32).square().sum(), grads, mx.array(0.0)))


def make_update(model, optimizer, clip_norm: float):
    state = [model.state, optimizer.state, mx.random.state]

    @partial(mx.compile, inputs=state, outputs=state)
    def update(grads, norm):
        if clip_norm > 0:
            scale = mx.minimum(clip_norm / (norm + 1e-6), 1.0)
            grads = tree_map(lambda g: g * scale, grads)
        optimizer.update(model, grads)

    return update
