"""One gradient computation of the training loop, compiled, and on a multi-core CPU split
across the cores.

MLX's CPU backend runs each stream's ops one at a time on that stream's thread: the products
are multi-threaded (BLAS), but layer norms, dropout, residual adds, GELU and cross-entropy
(~40 % of a fine-tuning step here) use one core. So on the CPU, `GradStep` splits the batch
into one shard per core and computes each shard on its own Python thread with its own MLX
stream, BLAS and attention kernel held to one thread each: every part of the step then runs
on all cores (`python -m bench.ablate --quick --rows finetune`, 2 cores: a fine-tuning step is
x1.34 slower with one shard; see bench/README.md). Each thread builds and evaluates its own
graph: evaluating two shards' graphs from one thread interleaves little (MLX schedules a
graph's nodes in order, a few at a time), and in MLX 0.32 a stream belongs to the thread that
made it.

The shards' losses and gradients are averaged weighted by their scored tokens, so the result
is the full batch's token mean, as without shards (up to float rounding); dropout differs.
(MLM with --nsp: the next-sentence loss, a mean over examples, is weighted by masked tokens
too, a slight difference from the whole batch's.) The shard count is one per core at each
start: a run resumed on another machine keeps its data order but draws other dropout masks.
"""
from __future__ import annotations

import logging
import os
import queue
import threading
from functools import partial
from typing import Callable, Sequence

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_map

from b2b import Bert2Bert
from b2b.runtime import cpu_threads, usable_cores

log = logging.getLogger(__name__)

# A loss returns (loss, aux); aux[WEIGHT] is the number of scored tokens the loss averages over.
WEIGHT = 1


def auto_shards(batch_size: int) -> int:
    """One shard per core on the CPU (B2B_CPU_SHARDS overrides the count), at most one per
    example; one on a GPU."""
    if mx.default_device() != mx.cpu:
        return 1
    wanted = os.environ.get("B2B_CPU_SHARDS", "")
    return max(1, min(int(wanted) if wanted.isdigit() and int(wanted) > 0 else usable_cores(), batch_size))


class _Shard(threading.Thread):
    """A thread with its own MLX stream that computes shards' losses and gradients. The threads
    live as long as the process: one whose stream has run compiled graphs aborts the process at
    exit if it ended earlier (MLX 0.32), so they are shared by every GradStep, never stopped."""

    lock = threading.Lock()  # the random state is global: seed, build a graph, advance it
    pool: list[_Shard] = []

    def __init__(self):
        super().__init__(daemon=True, name=f"b2b-grad-shard-{len(self.pool)}")
        self.jobs: queue.Queue = queue.Queue()
        self.start()

    @classmethod
    def get(cls, n: int) -> list[_Shard]:
        with cls.lock:
            cls.pool += [cls() for _ in range(n - len(cls.pool))]
            return cls.pool[:n]

    def run(self) -> None:
        with mx.stream(mx.new_stream(mx.cpu)):  # streams belong to their thread
            while True:
                fn, seed, arrays, built, failures, results = self.jobs.get()
                out = None
                try:
                    with self.lock:
                        mx.random.seed(seed)
                        out = fn(*(mx.array(a) for a in arrays))
                        mx.eval(mx.random.state)
                    built.wait()  # every shard's graph is built: they start computing together
                    mx.eval(out)  # the heavy part, beside the other shards'
                    box, out, fn = [out], None, None  # the caller takes the only reference: the
                    results.put(box)  # combination may then reuse the gradients' memory
                except BaseException as e:  # handed to the caller's thread; this one lives on
                    out = fn = None
                    if not isinstance(e, threading.BrokenBarrierError):
                        failures.append(e)  # in the order they happened: the first is the cause
                    built.abort()  # the other shards stop waiting
                    results.put(e)


class GradStep:
    """`step(seed, *arrays) -> (loss, aux, grads)`, evaluated: `loss_fn(model, *arrays)`'s
    value and gradients for one batch (numpy arrays, batch first), with dropout seeded by
    `seed`. `shards` > 1 splits the batch across that many threads (CPU only); `summed`:
    indices of aux entries that are counts, added over shards (the others are averaged like
    the loss)."""

    def __init__(self, model: Bert2Bert, loss_fn: Callable, shards: int = 1, summed: Sequence[int] = (WEIGHT,)):
        if shards > 1 and mx.default_device() != mx.cpu:
            log.warning("%d CPU shards asked for on %s: one is used (shards are for the CPU).", shards, mx.default_device())
            shards = 1
        self.shards, self.summed, self._model = shards, tuple(summed), model
        loss_and_grad = nn.value_and_grad(model, loss_fn)
        state = [model.state, mx.random.state]

        def make() -> Callable:
            # A new function each time: mx.compile caches by function, and each shard's trace
            # carries its own stream.
            def grad(*arrays):
                (loss, aux), grads = loss_and_grad(model, *arrays)
                return loss, aux, grads

            return partial(mx.compile, inputs=state, outputs=state)(grad)

        self._fn = make()  # the whole batch on the caller's thread (one shard, or a batch of one)
        self._combine = mx.compile(partial(_weighted_sum, summed=self.summed))
        self._shard_fns = [make() for _ in range(shards)] if shards > 1 else []
        # (glibc's malloc is tuned for this when b2b is imported: b2b.runtime.tune_malloc)

    def __call__(self, seed: int, *arrays: np.ndarray) -> tuple[mx.array, tuple[mx.array, ...], dict]:
        if not self._shard_fns or len(arrays[0]) < 2:
            mx.random.seed(seed)
            out = self._fn(*(mx.array(a) for a in arrays))
            mx.eval(out)
            return out
        parts = np.array_split(np.arange(len(arrays[0])), min(len(self._shard_fns), len(arrays[0])))
        mx.eval(self._model.state)  # a lazy weight would belong to this thread's stream, which the shards cannot run
        with cpu_threads(1):
            built, failures, results = threading.Barrier(len(parts)), [], [queue.Queue() for _ in parts]
            for i, (worker, rows) in enumerate(zip(_Shard.get(len(parts)), parts)):
                seed_i = (seed * 7919 + i) % (2**31)
                worker.jobs.put((self._shard_fns[i], seed_i, [a[rows] for a in arrays], built, failures, results[i]))
            outs = [r.get() for r in results]
        if failures:  # (a failed trace can leave the model unusable: the loop stops)
            raise failures[0]
        outs = [box.pop() for box in outs]
        counts = [float(o[1][WEIGHT].item()) for o in outs]
        total = sum(counts)
        weights = [c / total for c in counts] if total > 0 else [1.0 / len(outs)] * len(outs)
        losses, auxes, shard_grads = zip(*((o[0], list(o[1]), o[2]) for o in outs))
        loss, aux, grads = self._combine(mx.array(weights), losses, auxes, shard_grads)
        del outs, shard_grads  # only the graph holds the shards' gradients: the sum can reuse their memory
        mx.eval(loss, aux, grads)
        return loss, tuple(aux), grads


def _weighted_sum(weights: mx.array, losses: list, auxes: list, grads: list, summed: tuple[int, ...]):
    """The shards' losses, aux values and gradients combined: counts added, the rest weighted."""
    loss = sum(weights[i] * l for i, l in enumerate(losses))
    aux = [sum(a[j] if j in summed else weights[i] * a[j] for i, a in enumerate(auxes)) for j in range(len(auxes[0]))]
    total = tree_map(lambda *gs: sum(weights[i] * g for i, g in enumerate(gs)), *grads)
    return loss, aux, total
