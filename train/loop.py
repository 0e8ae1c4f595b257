"""The one training loop behind `train.pretrain` and `train.finetune`.

A task supplies batches (deterministic per epoch, so a resumed run sees the same data), a loss
and an evaluation; the loop owns the optimizer, schedule, compiled steps, gradient
accumulation and clipping, metrics, checkpoints, resume, Ctrl-C and non-finite losses."""
from __future__ import annotations

import dataclasses
import logging
import math
import os
import signal
import time
from dataclasses import dataclass
from typing import Callable, Protocol, Sequence

import mlx.core as mx
import mlx.optimizers as optim
import numpy as np
from mlx.utils import tree_map
from tqdm import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

from b2b import Bert2Bert, Tokenizer, runtime_info

from .checkpoints import TrainerState, list_checkpoints, prune_checkpoints, restore, save_run_checkpoint
from .lineage import write_init_lineage
from .optim import AdamW, global_norm, make_update
from .settings import TrainSettings
from .step import GradStep, auto_shards
from .writer import MetricWriter

log = logging.getLogger(__name__)


class TrainingStopped(RuntimeError):
    """The run cannot go on (repeated non-finite losses); the last good checkpoint is kept."""


class TrainingInterrupted(Exception):
    """Ctrl-C / SIGTERM stopped the run after a checkpoint was saved; `exit_code` is 128 + signal."""

    def __init__(self, message: str, exit_code: int):
        super().__init__(message)
        self.exit_code = exit_code


@dataclass
class Batch:
    arrays: tuple  # numpy arrays handed to the task's loss after conversion to mx
    tokens: int  # real (non-pad) tokens, for tokens/s
    examples: int


class Task(Protocol):
    name: str  # "mlm" or "summarization"
    metric: str  # "val/..." tag that picks the best checkpoint
    higher_is_better: bool
    aux_counts: tuple[int, ...]  # indices of the loss's aux values that are counts (aux[1]: scored tokens)

    def prepare(self, model: Bert2Bert) -> None:
        """Freeze what this task does not train; called on the model the loop trains (after a resume, the restored one)."""
        ...

    def num_batches(self) -> int: ...
    def batch(self, epoch: int, index: int, step: int) -> Batch: ...
    def loss(self, model: Bert2Bert, *arrays: mx.array) -> tuple[mx.array, tuple[mx.array, ...]]: ...
    def train_metrics(self, aux: Sequence[float]) -> dict[str, float]: ...
    def evaluate(self, model: Bert2Bert, step: int, writer: MetricWriter) -> dict[str, float]: ...


def make_schedule(s: TrainSettings, total_steps: int) -> Callable:
    warmup = min(s.warmup_steps, max(total_steps - 1, 0))
    decay_steps = max(total_steps - warmup, 1)
    if s.schedule == "cosine":
        decay = optim.cosine_decay(s.lr, decay_steps, end=s.lr * 0.01)
    elif s.schedule == "linear":
        decay = optim.linear_schedule(s.lr, s.lr * 0.01, decay_steps)
    else:
        decay = optim.linear_schedule(s.lr, s.lr, 1)  # constant, but an array like the others
    if warmup == 0:
        return decay
    return optim.join_schedules([optim.linear_schedule(s.lr * 0.01, s.lr, warmup), decay], [warmup])


def make_optimizer(s: TrainSettings, total_steps: int) -> optim.Optimizer:
    """AdamW on the schedule; with `--new-lr-scale`, cross-attention (the part a BERT warm start
    cannot initialise) and the pointer-generator get their own AdamW at a multiple of it, so it catches up with the
    pretrained rest instead of leaving the decoder a source-blind language model for longer."""
    base = AdamW(learning_rate=make_schedule(s, total_steps), weight_decay=s.weight_decay)
    if s.new_lr_scale == 1.0:
        return base
    scaled = dataclasses.replace(s, lr=s.lr * s.new_lr_scale)
    fresh = AdamW(learning_rate=make_schedule(scaled, total_steps), weight_decay=s.weight_decay)
    return optim.MultiOptimizer([fresh, base], [lambda path, _: ".cross_attn" in path or path.startswith("pointer.")])


def base_learning_rate(optimizer: optim.Optimizer) -> float:
    opt = optimizer.optimizers[-1] if isinstance(optimizer, optim.MultiOptimizer) else optimizer
    return float(opt.learning_rate.item()) if isinstance(opt.learning_rate, mx.array) else float(opt.learning_rate)


class _StopFlag:
    """Ctrl-C / SIGTERM ask the loop to save and leave after the current step."""

    def __init__(self):
        self.requested = False
        self.signum = 0

    def __enter__(self):
        self._old = {sig: signal.signal(sig, self._handle) for sig in (signal.SIGINT, signal.SIGTERM)}
        return self

    def _handle(self, signum, frame):
        if self.requested:  # a second Ctrl-C: leave now
            raise KeyboardInterrupt
        self.requested, self.signum = True, signum
        log.warning("Stopping: saving a checkpoint after this step (Ctrl-C again to abort without saving).")

    def __exit__(self, *exc):
        for sig, old in self._old.items():
            signal.signal(sig, old)


def run(
    model: Bert2Bert,
    tokenizer: Tokenizer,
    task: Task,
    s: TrainSettings,
    run_dir: str,
    progress: bool = True,
) -> TrainerState:
    """Train `model` on `task` with settings `s`, writing events, metrics and checkpoints in
    `run_dir`. With `s.resume`, the newest complete checkpoint there is restored first.
    Raises TrainingStopped after repeated non-finite steps and TrainingInterrupted after a
    Ctrl-C (each once the last good checkpoint is on disk)."""
    per_epoch = task.num_batches() // s.grad_accum
    if per_epoch < 1:
        raise ValueError(f"Not enough data for one optimizer step: {task.num_batches()} batches, --grad-accum {s.grad_accum}.")
    total = s.max_steps or math.ceil(s.epochs * per_epoch)
    optimizer = make_optimizer(s, total)
    state = TrainerState(task=task.name, seed=s.seed, metric_name=task.metric)
    checkpoints = list_checkpoints(run_dir)
    if s.resume and checkpoints:
        model, tokenizer, state = restore(checkpoints[-1][1], optimizer)
        if state.metric_name and state.metric_name != task.metric:
            raise ValueError(
                f"{checkpoints[-1][1]} chose its best checkpoint by {state.metric_name}, these settings by {task.metric}: "
                "resume with the run's own settings, or choose another --out."
            )
        log.info("Resumed %s at step %d (epoch %d, batch %d).", checkpoints[-1][1], state.step, state.epoch, state.batch_in_epoch)
    elif s.resume:
        log.warning("--resume: no checkpoint in %s yet, starting from scratch.", run_dir)
    elif checkpoints:
        raise ValueError(f"{run_dir} already holds checkpoints: pass --resume to continue it, or choose another --out.")
    os.makedirs(run_dir, exist_ok=True)  # only now: a run refused above leaves no empty folder
    task.prepare(model)
    model.train()
    s.save(run_dir)
    if not (s.resume and checkpoints):
        write_init_lineage(run_dir, s.init)  # the runs behind the --init checkpoint, for the model card

    shards = s.cpu_shards or auto_shards(s.batch_size)
    grad_step = GradStep(model, task.loss, shards, task.aux_counts)
    grad_norm = mx.compile(global_norm)
    apply_step = make_update(model, optimizer, s.clip_norm)

    writer = MetricWriter(run_dir, flush_secs=s.flush_secs, purge_step=state.step + 1 if s.resume else None)
    writer.hparams({"settings": vars(s), "model": model.config.to_dict(), "runtime": runtime_info(), "task": task.name})
    log.info("Training %s: %d steps (%d per epoch), %.1fM parameters, BLAS %s, %d batch shard%s.", task.name, total,
             per_epoch, model.num_parameters() / 1e6, runtime_info()["blas"], grad_step.shards, "s" * (grad_step.shards > 1))
    bar = tqdm(total=total, initial=state.step, disable=not progress, dynamic_ncols=True, desc=task.name)
    window = {"tokens": 0, "time": 0.0, "loss": [], "aux": []}
    bad_kinds: list[str] = []  # what went non-finite in the current run of bad steps

    def skip_bad_step(kind: str, detail: str) -> None:
        """Count a step whose update is skipped (a non-finite loss or gradient norm); stop
        the run after `max_bad_steps` in a row."""
        bad_kinds.append(kind)
        state.nonfinite_steps += 1
        writer.scalar("train/nonfinite_steps", state.nonfinite_steps, state.step)
        log.warning("Non-finite %s at step %d%s: update skipped (%d in a row).", kind, state.step, detail, len(bad_kinds))
        if len(bad_kinds) >= s.max_bad_steps:
            kept = list_checkpoints(run_dir)
            what = {"loss": "losses", "gradient norm": "gradient norms"}
            kinds = " or ".join(what[k] for k in sorted(set(bad_kinds), key=list(what).index))
            raise TrainingStopped(
                f"{len(bad_kinds)} non-finite {kinds} in a row at step {state.step}: lower --lr or check the data; "
                + (f"the last good checkpoint is {kept[-1][1]}." if kept else "no checkpoint had been saved yet.")
            )

    def save() -> None:
        writer.flush()  # the curve up to a checkpoint is on disk before it: a resume has no gap
        save_run_checkpoint(run_dir, model, tokenizer, optimizer, state, s.save_dtype)
        prune_checkpoints(run_dir, s.keep_last, state.best_step)

    def evaluate() -> None:
        model.eval()
        metrics = task.evaluate(model, state.step, writer)
        model.train()
        writer.scalars(metrics, state.step)
        state.last_eval = {k: round(v, 4) for k, v in metrics.items()}
        value = metrics.get(task.metric)
        if value is not None and (
            state.best_metric is None or (value > state.best_metric if task.higher_is_better else value < state.best_metric)
        ):
            state.best_metric, state.best_step = float(value), state.step
            writer.scalar("val/best", value, state.step)
        log.info("step %d: %s", state.step, ", ".join(f"{k}={v:.4g}" for k, v in metrics.items()))

    with _StopFlag() as stop, writer, logging_redirect_tqdm():
        while state.step < total and not stop.requested:
            started = time.perf_counter()
            grads_sum, losses, auxes, tokens, examples = None, [], [], 0, 0
            for _ in range(s.grad_accum):
                if state.batch_in_epoch >= per_epoch * s.grad_accum:
                    state.epoch, state.batch_in_epoch = state.epoch + 1, 0
                # Dropout and masking depend only on (seed, step, micro-batch[, shards]): resume is exact.
                batch = task.batch(state.epoch, state.batch_in_epoch, state.step)
                loss, aux, grads = grad_step(hash((s.seed, state.step, state.batch_in_epoch)) % (2**31), *batch.arrays)
                grads_sum = grads if grads_sum is None else tree_map(mx.add, grads_sum, grads)
                mx.eval(loss, aux, grads_sum)
                losses.append(loss.item())
                auxes.append([a.item() for a in aux])
                tokens, examples = tokens + batch.tokens, examples + batch.examples
                state.batch_in_epoch += 1
            mean_loss = float(np.mean(losses))
            if not math.isfinite(mean_loss):
                skip_bad_step("loss", "")
                continue
            if s.grad_accum > 1:
                grads_sum = tree_map(lambda g: g / s.grad_accum, grads_sum)
            norm = grad_norm(grads_sum)
            mx.eval(norm)
            # A finite loss can still have inf/NaN gradients; clipping would spread them to every weight.
            if not math.isfinite(norm.item()):
                skip_bad_step("gradient norm", f" (loss {mean_loss:.4g})")
                continue
            bad_kinds.clear()
            apply_step(grads_sum, norm)
            mx.eval(model.parameters(), optimizer.state)
            elapsed = time.perf_counter() - started
            state.step += 1
            state.tokens_seen += tokens
            state.examples_seen += examples
            state.wall_seconds += elapsed
            window["tokens"] += tokens
            window["time"] += elapsed
            window["loss"].append(mean_loss)
            window["aux"].append(np.mean(auxes, axis=0))
            bar.update(1)
            if state.step % s.log_every == 0 or state.step == total:
                tps = window["tokens"] / max(window["time"], 1e-9)
                lr = base_learning_rate(optimizer)
                metrics = {
                    "train/loss": float(np.mean(window["loss"])),
                    "train/lr": lr,
                    "train/grad_norm": float(norm.item()),
                    "train/tokens_per_sec": tps,
                    "train/epoch": state.epoch + state.batch_in_epoch / (per_epoch * s.grad_accum),
                    **task.train_metrics(np.mean(window["aux"], axis=0)),
                }
                writer.scalars(metrics, state.step)
                bar.set_postfix(loss=f"{metrics['train/loss']:.3f}", lr=f"{lr:.2e}", tok_s=f"{tps:.0f}")
                window = {"tokens": 0, "time": 0.0, "loss": [], "aux": []}
            if s.eval_every and state.step % s.eval_every == 0:
                best_before = state.best_step
                evaluate()
                if state.best_step != best_before and not (s.save_every and state.step % s.save_every == 0):
                    save()  # a new best is always on disk
            if s.save_every and state.step % s.save_every == 0:
                save()
        final_eval = not stop.requested and bool(s.eval_every) and state.step % s.eval_every != 0
        if stop.requested:
            log.info("Interrupted at step %d: saving.", state.step)
        elif final_eval:
            evaluate()
        # Saved again after a final evaluation: trainer_state.json then holds its scores and best step.
        if final_eval or not list_checkpoints(run_dir) or list_checkpoints(run_dir)[-1][0] != state.step:
            save()
    bar.close()
    if stop.requested and state.step < total:  # a signal during the last step: the run is done
        raise TrainingInterrupted(
            f"Stopped at step {state.step} by a signal; its checkpoint is in {os.path.join(run_dir, 'checkpoints')}: continue with --resume.",
            128 + stop.signum,
        )
    log.info("Done: step %d, %d examples, %.0f s; checkpoints in %s.", state.step, state.examples_seen,
             state.wall_seconds, os.path.join(run_dir, "checkpoints"))
    return state
