"""Training settings: one dataclass per loop; the command line is generated from the fields."""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import typing
from dataclasses import dataclass, field


@dataclass
class TrainSettings:
    """Settings shared by every loop. Help text lives in `metadata["help"]`."""

    out: str = field(default="logs/run", metadata={"help": "run folder: events, metrics.jsonl, checkpoints/"})
    preset: str = field(default="seed", metadata={"help": "architecture preset: tiny, seed, minilm, base"})
    init: str = field(default="", metadata={"help": "warm start: a b2b checkpoint or a Hugging Face BERT folder / hub id"})
    seed: int = 0
    batch_size: int = 16
    grad_accum: int = field(default=1, metadata={"help": "micro-batches per optimizer step"})
    lr: float = 1e-4
    weight_decay: float = 0.01
    new_lr_scale: float = field(default=1.0, metadata={"help": "learning-rate multiplier for weights a warm start leaves freshly initialised (cross-attention)"})
    warmup_steps: int = 500
    schedule: str = field(default="linear", metadata={"help": "decay after warmup: linear, cosine or constant"})
    max_steps: int = field(default=0, metadata={"help": "optimizer steps (0: use --epochs)"})
    epochs: float = 1.0
    clip_norm: float = 1.0
    dropout: float = field(default=-1.0, metadata={"help": "override the architecture's dropout (-1: keep)"})
    log_every: int = 10
    eval_every: int = 500
    save_every: int = 500
    keep_last: int = field(default=2, metadata={"help": "checkpoints to keep besides the best"})
    save_dtype: str = field(default="float32", metadata={"help": "weights precision in checkpoints"})
    resume: bool = field(default=False, metadata={"help": "continue the run in --out from its newest checkpoint"})
    max_bad_steps: int = field(default=5, metadata={"help": "consecutive non-finite losses before the run stops"})
    flush_secs: float = 2.0

    def validate(self) -> None:
        """Raise ValueError with one sentence for settings that cannot work."""
        if self.batch_size < 1 or self.grad_accum < 1:
            raise ValueError("--batch-size and --grad-accum must be at least 1.")
        if self.lr <= 0:
            raise ValueError("--lr must be positive.")
        if self.schedule not in ("linear", "cosine", "constant"):
            raise ValueError("--schedule must be linear, cosine or constant.")
        if self.max_steps < 0 or (self.max_steps == 0 and self.epochs <= 0):
            raise ValueError("Give a positive --max-steps or --epochs.")
        if self.save_dtype not in ("float32", "float16", "bfloat16"):
            raise ValueError("--save-dtype must be float32, float16 or bfloat16.")

    def save(self, folder: str) -> None:
        with open(os.path.join(folder, "settings.json"), "w") as f:
            json.dump(dataclasses.asdict(self), f, indent=2)


def parse_settings(cls: type, argv: list[str] | None = None, description: str = "") -> TrainSettings:
    """argparse over the dataclass fields: `--batch-size 8`, booleans as `--flag / --no-flag`."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        flag = "--" + f.name.replace("_", "-")
        kind = hints[f.name]
        help_text = f.metadata.get("help", " ")
        if kind is bool:
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=f.default, help=help_text)
        else:
            parser.add_argument(flag, type=kind, default=f.default, help=help_text)
    settings = cls(**vars(parser.parse_args(argv)))
    try:
        settings.validate()
    except ValueError as e:
        parser.error(str(e))
    return settings
