"""Training settings: one dataclass per loop; the command line is generated from the fields.

With `--resume`, the run folder's `settings.json` supplies the defaults: a resumed run keeps its
data, model and batching unless a flag says otherwise, and flags that would make it a different
run (`RUN_IDENTITY`) are refused."""
from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import typing
from dataclasses import dataclass, field
from typing import ClassVar

from b2b import dtype_name

from .checkpoints import list_checkpoints

log = logging.getLogger(__name__)
SETTINGS = "settings.json"


@dataclass
class TrainSettings:
    """Settings shared by every loop. Help text lives in `metadata["help"]`."""

    # Fields a resumed run may not change: they pick the model, the data or its order.
    RUN_IDENTITY: ClassVar[tuple[str, ...]] = ("preset", "init", "seed", "batch_size", "grad_accum")
    # What a setting added later meant for runs saved before it existed: a resumed old run
    # keeps doing what it did.
    BEFORE_IT_EXISTED: ClassVar[dict[str, object]] = {}

    out: str = field(default="logs/run", metadata={"help": "run folder: events, metrics.jsonl, checkpoints/"})
    preset: str = field(default="seed", metadata={"help": "architecture preset: tiny, seed, minilm, base"})
    init: str = field(default="", metadata={"help": "warm start: a b2b checkpoint, a run folder (its newest checkpoint) or a Hugging Face BERT folder / hub id"})
    seed: int = field(default=0, metadata={"help": "random seed: initialisation, data order, masking and dropout"})
    batch_size: int = field(default=16, metadata={"help": "examples per micro-batch"})
    grad_accum: int = field(default=1, metadata={"help": "micro-batches per optimizer step"})
    lr: float = field(default=1e-4, metadata={"help": "peak learning rate (AdamW), reached after --warmup-steps"})
    weight_decay: float = field(default=0.01, metadata={"help": "AdamW weight decay, decoupled from the gradient step"})
    new_lr_scale: float = field(default=1.0, metadata={"help": "learning-rate multiplier for weights a warm start leaves freshly initialised (cross-attention, a pointer-generator)"})
    warmup_steps: int = field(default=500, metadata={"help": "steps of linear learning-rate warm-up from 0"})
    schedule: str = field(default="linear", metadata={"help": "decay after warmup: linear, cosine or constant"})
    max_steps: int = field(default=0, metadata={"help": "optimizer steps (0: use --epochs)"})
    epochs: float = field(default=1.0, metadata={"help": "passes over the training data, when --max-steps is 0 (may be fractional)"})
    clip_norm: float = field(default=1.0, metadata={"help": "clip the global gradient norm to this (0: no clipping)"})
    dropout: float = field(default=-1.0, metadata={"help": "override the architecture's dropout (-1: keep)"})
    log_every: int = field(default=10, metadata={"help": "steps between logged training loss / speed points"})
    eval_every: int = field(default=500, metadata={"help": "steps between evaluations (0: none)"})
    save_every: int = field(default=500, metadata={"help": "steps between checkpoints (0: only at the end, on Ctrl-C and at a new best)"})
    keep_last: int = field(default=2, metadata={"help": "newest checkpoints to keep besides the best (at least 1)"})
    save_dtype: str = field(default="float32", metadata={"help": "weights precision in checkpoints"})
    resume: bool = field(default=False, metadata={"help": "continue the run in --out from its newest checkpoint; its settings.json gives the defaults, and flags that would change the data or model are refused"})
    max_bad_steps: int = field(default=5, metadata={"help": "consecutive non-finite losses or gradient norms before the run stops"})
    flush_secs: float = field(default=2.0, metadata={"help": "seconds between writes of metrics.jsonl and the TensorBoard events (what live curves see)"})
    cpu_shards: int = field(default=0, metadata={"help": "on the CPU, split each batch across this many threads, one core each (0: one per core; 1: off)"})

    def validate(self) -> None:
        """Raise ValueError with one sentence for settings that cannot work."""
        if self.batch_size < 1 or self.grad_accum < 1:
            raise ValueError("--batch-size and --grad-accum must be at least 1.")
        if self.lr <= 0:
            raise ValueError("--lr must be positive.")
        if self.new_lr_scale <= 0:
            raise ValueError("--new-lr-scale must be positive.")
        if self.weight_decay < 0 or self.warmup_steps < 0 or self.clip_norm < 0:
            raise ValueError("--weight-decay, --warmup-steps and --clip-norm cannot be negative.")
        if self.schedule not in ("linear", "cosine", "constant"):
            raise ValueError("--schedule must be linear, cosine or constant.")
        if self.max_steps < 0 or (self.max_steps == 0 and self.epochs <= 0):
            raise ValueError("Give a positive --max-steps or --epochs.")
        if self.log_every < 1:
            raise ValueError("--log-every must be at least 1.")
        if self.eval_every < 0 or self.save_every < 0:
            raise ValueError("--eval-every and --save-every cannot be negative (0 turns periodic evaluation or saving off).")
        if self.keep_last < 1:
            raise ValueError("--keep-last must be at least 1: the newest checkpoint is what --resume continues from.")
        if self.cpu_shards < 0:
            raise ValueError("--cpu-shards cannot be negative (0 picks one per core).")
        if self.max_bad_steps < 1:
            raise ValueError("--max-bad-steps must be at least 1.")
        # Same names and aliases (fp16, bf16, ...) as b2b.save_checkpoint; int8 is for shipping only.
        self.save_dtype = dtype_name(self.save_dtype, ("float32", "float16", "bfloat16"))

    def check_resume(self, saved: dict) -> None:
        """Raise ValueError (one sentence) when these settings would make a resume of the run
        saved as `saved` a different run: other data, model or batching."""
        changed = [k for k in self.RUN_IDENTITY if k in saved and not _same_value(getattr(self, k), saved[k])]
        if changed:
            now = " ".join(f"{_flag(k)} {getattr(self, k)!r}" for k in changed)
            then = " ".join(f"{_flag(k)} {saved[k]!r}" for k in changed)
            raise ValueError(
                f"--resume cannot change {', '.join(map(_flag, changed))}: the run in {self.out} was started with "
                f"{then}, not {now}; leave these flags out to keep its values, or choose another --out."
            )

    def save(self, folder: str) -> None:
        # Written aside, then renamed: a kill mid-write must not leave a file that breaks --resume.
        path = os.path.join(folder, SETTINGS)
        with open(path + ".tmp", "w") as f:
            json.dump(dataclasses.asdict(self), f, indent=2)
        os.replace(path + ".tmp", path)


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _same_value(a: object, b: object) -> bool:
    """Equal, or two spellings of one existing path (`../data/x` and `/abs/data/x`)."""
    if a == b:
        return True
    return isinstance(a, str) and isinstance(b, str) and bool(a and b) and os.path.exists(a) and (
        os.path.realpath(a) == os.path.realpath(b)
    )


def saved_settings(cls: type, run_dir: str) -> dict:
    """The settings a run in `run_dir` was started with (its `settings.json`), limited to the
    fields of `cls`; {} when the run has no checkpoint yet (nothing to continue) or no file."""
    path = os.path.join(run_dir, SETTINGS)
    if not os.path.isfile(path) or not list_checkpoints(run_dir):
        return {}
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError) as e:
        raise ValueError(f"Cannot resume from {run_dir}: its {SETTINGS} is unreadable ({e}).") from e
    if not isinstance(data, dict):
        raise ValueError(f"Cannot resume from {run_dir}: its {SETTINGS} does not hold a settings object.")
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - known)
    if unknown:
        log.warning("Ignoring unknown settings in %s: %s.", path, ", ".join(unknown))
    data = {**getattr(cls, "BEFORE_IT_EXISTED", {}), **data}
    return {k: v for k, v in data.items() if k in known and k not in ("out", "resume")}


def build_parser(cls: type, description: str = "") -> argparse.ArgumentParser:
    """argparse over the dataclass fields: `--batch-size 8`, booleans as `--flag / --no-flag`."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        flag = _flag(f.name)
        kind = hints[f.name]
        help_text = _help(cls, f.name)
        if kind is bool:
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=f.default, help=help_text)
        else:
            parser.add_argument(flag, type=kind, default=f.default, help=help_text)
    return parser


def _help(cls: type, name: str) -> str:
    """A field's help text; a subclass that only changes a default (`lr: float = 5e-5`) keeps
    the help its base class wrote."""
    for klass in cls.__mro__:
        for f in dataclasses.fields(klass) if dataclasses.is_dataclass(klass) else ():
            if f.name == name and f.metadata.get("help"):
                return f.metadata["help"]
    return name.replace("_", " ")


def parse_settings(cls: type, argv: list[str] | None = None, description: str = "") -> TrainSettings:
    """Settings from the command line; with `--resume` of a run that has a checkpoint, fields
    not given on the command line come from its settings.json. Bad settings end the program
    through `parser.error` (one sentence, exit code 2)."""
    parser = build_parser(cls, description)
    args = parser.parse_args(argv)
    try:
        saved = saved_settings(cls, args.out) if args.resume else {}
    except ValueError as e:
        parser.error(str(e))
    if saved:
        parser.set_defaults(**saved)
        args = parser.parse_args(argv)
        log.info("--resume: settings not given on the command line come from %s.", os.path.join(args.out, SETTINGS))
    settings = cls(**vars(args))
    try:
        if saved:
            settings.check_resume(saved)
        settings.validate()
    except ValueError as e:
        parser.error(str(e))
    return settings
