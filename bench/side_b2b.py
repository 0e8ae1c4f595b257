"""The b2b side of each row: the same compiled step as `train.loop` and `b2b.generate`."""
from __future__ import annotations

import os
import time

import numpy as np

import b2b  # noqa: F401 - preloads the BLAS before mlx.core
import mlx.core as mx

from b2b import B2BConfig, Bert2Bert, DecodingConfig, generate
from train.finetune import SummarizationTask
try:
    from train.optim import AdamW, global_norm, make_update
except ImportError:  # `bench.ablate --baseline` with code from before train/optim.py
    from bench._old_update import AdamW, global_norm, make_update
from train.losses import mlm_loss, seq2seq_loss
from train.pretrain import MLMTask
from train.step import GradStep, auto_shards


def load(folder: str) -> Bert2Bert:
    model = Bert2Bert(B2BConfig.load(folder))
    model.load_weights(os.path.join(folder, "model.safetensors"), strict=True)
    mx.eval(model.parameters())
    return model


class Side:
    name = "b2b"

    def __init__(self, inputs: dict[str, np.ndarray]):
        self.x = inputs
        self.model: Bert2Bert | None = None
        self.info = {"framework": f"mlx {mx.__version__}", **{k: v for k, v in b2b.runtime_info().items() if k in ("blas", "blas_core", "device")}}

    # -- training ------------------------------------------------------------------------------
    def train_setup(self, task: str, folder: str) -> dict:
        x = self.x
        model = self.model = load(folder)
        if task == "mlm":
            arrays = [x[k] for k in ("mlm_inputs", "mlm_mask", "mlm_positions", "mlm_labels", "mlm_weights")]
            loss_fn, counts = mlm_loss, MLMTask.aux_counts
        else:
            arrays = [x[k] for k in ("ft_src", "ft_mask", "ft_tgt")]
            loss_fn, counts = seq2seq_loss, SummarizationTask.aux_counts
        model.eval()
        check = float(loss_fn(model, *(mx.array(a) for a in arrays))[0].item())  # no dropout: must equal HF's loss
        model.train()
        optimizer = AdamW(learning_rate=1e-4, weight_decay=0.01)
        shards = auto_shards(len(arrays[0]))
        grad_step = self._grad_step = GradStep(model, loss_fn, shards, counts)  # train.loop's
        grad_norm, apply_step = mx.compile(global_norm), make_update(model, optimizer, 1.0)  # and its update
        seeds = iter(range(1 << 30))

        def step() -> float:
            loss, aux, grads = grad_step(next(seeds), *arrays)
            value = loss.item()
            [a.item() for a in aux]
            norm = grad_norm(grads)
            norm.item()  # (the loop checks that it is finite)
            apply_step(grads, norm)
            mx.eval(model.parameters(), optimizer.state)
            return value

        self._step, self._optimizer = step, optimizer
        return {"eval_loss": check, "shards": shards}

    def train_step(self) -> dict:
        t = time.perf_counter()
        loss = self._step()
        return {"seconds": time.perf_counter() - t, "loss": loss}

    def teardown(self) -> None:
        self.model = self._step = self._optimizer = self._grad_step = None
        mx.clear_cache()

    # -- generation ----------------------------------------------------------------------------
    def gen_setup(self, folder: str) -> dict:
        self.model = load(folder)
        self.model.eval()
        return {}

    def generate(self, rows: list[int], beams: int, max_new_tokens: int) -> dict:
        ids, lengths = self.x["gen_ids"][rows], self.x["gen_lengths"][rows]
        ids = ids[:, : int(lengths.max())]
        mask = (np.arange(ids.shape[1])[None, :] < lengths[:, None]).astype(np.int32)
        cfg = DecodingConfig(max_length=max_new_tokens, num_beams=beams, no_repeat_ngram_size=0, length_penalty=1.0, early_stopping=True)
        t = time.perf_counter()
        hyps = generate(self.model, mx.array(ids), mx.array(mask), cfg)
        seconds = time.perf_counter() - t
        return {"seconds": seconds, "tokens": [h.tokens for h in hyps]}

    # -- matmul peak ---------------------------------------------------------------------------
    def matmul(self, m: int, k: int, n: int, repeats: int) -> dict:
        a, b = mx.random.normal((m, k)), mx.random.normal((k, n))
        mx.eval(a @ b)
        best = float("inf")
        for _ in range(repeats):
            t = time.perf_counter()
            mx.eval(a @ b)
            best = min(best, time.perf_counter() - t)
        return {"gflops": 2 * m * k * n / best / 1e9}
