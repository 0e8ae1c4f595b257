"""Checkpoint policy for runs: `RUN/checkpoints/step_NNNNNNN/` folders holding a b2b checkpoint
plus `optimizer.safetensors` and `trainer_state.json`; keep the last K and the best."""
from __future__ import annotations

import json
import logging
import os
import re
import shutil
from dataclasses import asdict, dataclass, field

import mlx.core as mx
import mlx.optimizers as optim
from mlx.utils import tree_flatten, tree_unflatten

from b2b import Bert2Bert, Tokenizer, is_checkpoint, load_checkpoint, save_checkpoint

log = logging.getLogger(__name__)
_STEP_DIR = re.compile(r"^step_(\d{7,})$")
STATE = "trainer_state.json"
OPTIMIZER = "optimizer.safetensors"


@dataclass
class TrainerState:
    """Everything besides weights and optimizer moments that a resumed run needs."""

    task: str = ""  # "mlm" or "summarization"
    step: int = 0  # optimizer steps done
    epoch: int = 0  # data position: epoch and next micro-batch within it
    batch_in_epoch: int = 0
    seed: int = 0
    best_metric: float | None = None
    best_step: int | None = None
    metric_name: str = ""
    nonfinite_steps: int = 0
    tokens_seen: int = 0
    examples_seen: int = 0
    wall_seconds: float = 0.0
    last_eval: dict = field(default_factory=dict)

    @classmethod
    def load(cls, folder: str) -> "TrainerState":
        with open(os.path.join(folder, STATE)) as f:
            data = json.load(f)
        known = cls.__dataclass_fields__
        return cls(**{k: v for k, v in data.items() if k in known})


def step_dir(run_dir: str, step: int) -> str:
    return os.path.join(run_dir, "checkpoints", f"step_{step:07d}")


def run_dir_of(checkpoint: str) -> str | None:
    """The run folder a `RUN/checkpoints/step_N` checkpoint belongs to (step_dir's inverse);
    None for a checkpoint elsewhere (shipped, copied, hand-made), whose grandparent is not its run."""
    parent = os.path.dirname(os.path.abspath(checkpoint))
    return os.path.dirname(parent) if os.path.basename(parent) == "checkpoints" else None


def read_run_settings(run_dir: str | None) -> dict:
    """The run's settings.json as written at its start; {} when absent or unreadable (a shipped
    folder, a hand-made checkpoint): callers use it to describe, never to resume."""
    if run_dir is None:
        return {}
    try:
        with open(os.path.join(run_dir, "settings.json"), encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def list_checkpoints(run_dir: str) -> list[tuple[int, str]]:
    """(step, path) of the complete checkpoints of a run, oldest first."""
    root = os.path.join(run_dir, "checkpoints")
    if not os.path.isdir(root):
        return []
    found = []
    for name in os.listdir(root):
        m = _STEP_DIR.match(name)
        path = os.path.join(root, name)
        if m and is_checkpoint(path) and os.path.isfile(os.path.join(path, STATE)):
            found.append((int(m.group(1)), path))
    return sorted(found)


def save_run_checkpoint(
    run_dir: str, model: Bert2Bert, tokenizer: Tokenizer, optimizer: optim.Optimizer, state: TrainerState, dtype: str
) -> str:
    """Write the step's checkpoint atomically (weights, tokenizer, optimizer, trainer state)."""
    opt_arrays = dict(tree_flatten(optimizer.state))
    path = save_checkpoint(
        model,
        tokenizer,
        step_dir(run_dir, state.step),
        dtype=None if dtype == "float32" else dtype,
        extra={STATE: asdict(state)},
        arrays={OPTIMIZER: opt_arrays},
    )
    return path


def prune_checkpoints(run_dir: str, keep_last: int, best_step: int | None) -> None:
    """Delete all but the newest `keep_last` checkpoints and the best one. The newest is
    always kept (what --resume continues from), whatever `keep_last` says."""
    ckpts = list_checkpoints(run_dir)
    keep = {s for s, _ in ckpts[-max(keep_last, 1):]}
    if best_step is not None:
        keep.add(best_step)
    for s, path in ckpts:
        if s not in keep:
            shutil.rmtree(path, ignore_errors=True)
    root = os.path.join(run_dir, "checkpoints")  # leftovers of a save killed mid-write
    for name in os.listdir(root) if os.path.isdir(root) else []:
        if name.endswith((".tmp", ".old")):
            shutil.rmtree(os.path.join(root, name), ignore_errors=True)


def restore(path: str, optimizer: optim.Optimizer) -> tuple[Bert2Bert, Tokenizer, TrainerState]:
    """Model, tokenizer and trainer state from a run checkpoint; fills the optimizer's state."""
    model, tokenizer = load_checkpoint(path)
    opt_path = os.path.join(path, OPTIMIZER)
    if os.path.isfile(opt_path):
        optimizer.state = tree_unflatten(list(mx.load(opt_path).items()))
    else:
        log.warning("No %s in %s: the optimizer restarts from zero moments.", OPTIMIZER, path)
    return model, tokenizer, TrainerState.load(path)


def load_for_decoding(path: str, dtype: str | None = None) -> tuple[Bert2Bert, Tokenizer]:
    """`load_checkpoint`, plus the source length a summarization run checkpoint written before
    decoding.json existed was trained on, from its run's settings.json (`max_source_len`):
    without it such a checkpoint would be read at every position, not at its training length."""
    model, tokenizer = load_checkpoint(path, dtype=dtype)
    if model.trained_source_length is None and os.path.isfile(os.path.join(path, STATE)):
        n = read_run_settings(run_dir_of(path)).get("max_source_len")
        if TrainerState.load(path).task == "summarization" and isinstance(n, int) and n >= 3:
            model.trained_source_length = min(n, model.config.max_positions)
            log.info("%s has no decoding.json: reading %d source tokens, its run's --max-source-len.", path, model.trained_source_length)
    return model, tokenizer
