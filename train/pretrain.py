"""MLM (+ optional NSP) pretraining of the BERT encoder.

    python -m train.pretrain --data ../shared/data/wikitext2 --preset seed --out logs/mlm
"""
from __future__ import annotations

import logging
import math
import sys
from dataclasses import dataclass, field
from typing import ClassVar

import mlx.core as mx
import numpy as np

from b2b import Bert2Bert, Tokenizer

from .data import folder_has_split
from .command import run_command
from .loop import Batch
from .losses import mlm_loss
from .masking import mask_tokens, max_predictions
from .settings import TrainSettings
from .text_data import load_text_documents, make_nsp_pairs, pack_mlm_blocks
from .writer import MetricWriter

log = logging.getLogger(__name__)


@dataclass
class PretrainSettings(TrainSettings):
    RUN_IDENTITY: ClassVar[tuple[str, ...]] = TrainSettings.RUN_IDENTITY + ("data", "data_config", "val_data", "block_size", "nsp")

    data: str = field(default="tests/fixtures/wikitext_sample.tokens", metadata={"help": "text file/folder, or a hub dataset name"})
    data_config: str = field(default="", metadata={"help": "hub dataset config, e.g. wikitext-2-raw-v1"})
    val_data: str = field(default="", metadata={"help": "validation text (default: the validation files of a --data folder, else 2%% of --data held out)"})
    block_size: int = field(default=128, metadata={"help": "tokens per training block (text is packed into blocks)"})
    nsp: bool = field(default=False, metadata={"help": "add next-sentence prediction"})
    mask_rate: float = field(default=0.15, metadata={"help": "share of tokens chosen for the MLM loss (BERT: 80%% [MASK], 10%% random, 10%% kept)"})
    val_batches: int = field(default=20, metadata={"help": "validation batches for val/loss and accuracy"})
    lr: float = 5e-4
    out: str = "logs/mlm"

    def validate(self) -> None:
        super().validate()
        if self.block_size < (5 if self.nsp else 4):
            raise ValueError("--block-size must be at least 4 (5 with --nsp).")
        if not 0 < self.mask_rate < 1:
            raise ValueError("--mask-rate must be between 0 and 1.")
        if self.val_batches < 1:
            raise ValueError("--val-batches must be at least 1.")


class MLMTask:
    name = "mlm"
    metric = "val/loss"
    higher_is_better = False
    aux_counts = (1, 2, 4)  # mlm_loss: (loss, scored tokens, correct, nsp loss, nsp correct)

    def __init__(self, s: PretrainSettings, tokenizer: Tokenizer):
        self.s, self.tok = s, tokenizer
        docs = load_text_documents(s.data, config=s.data_config or None)
        val_source = s.val_data or (s.data if folder_has_split(s.data, "validation", pairs=False) else "")
        if val_source:
            val_docs = load_text_documents(val_source, split="validation", config=s.data_config or None)
            log.info("Validation: %d documents from %s.", len(val_docs), val_source)
        else:  # hold out the last 2% of documents (at least one; two for NSP's random halves)
            cut = max(2 if s.nsp else 1, len(docs) * 2 // 100)
            docs, val_docs = docs[:-cut] or docs, docs[-cut:]
            log.info("Validation: the last %d documents of %s, held out from training (no --val-data, no validation split).", cut, s.data)
        self.train = self._blocks(docs, np.random.default_rng(s.seed))
        self.val = self._blocks(val_docs, np.random.default_rng(s.seed + 1))
        self.specials = {tokenizer.pad_id, tokenizer.cls_id, tokenizer.sep_id, tokenizer.mask_id, tokenizer.unk_id}
        self.slots = max_predictions(s.block_size, s.mask_rate)
        log.info("MLM data: %d train and %d validation blocks of %d tokens.", len(self.train[0]), len(self.val[0]), s.block_size)

    def prepare(self, model: Bert2Bert) -> None:
        """Train the encoder and its MLM/NSP heads only: a frozen decoder gets no AdamW update,
        so weight decay does not shrink weights the MLM loss never reaches. (The decoder's word
        table is the encoder's, so it stays trainable.)"""
        model.freeze()
        model.encoder.unfreeze()

    def _blocks(self, docs: list[str], rng: np.random.Generator):
        if self.s.nsp:
            return make_nsp_pairs(docs, self.tok, self.s.block_size, rng)
        ids = pack_mlm_blocks(docs, self.tok, self.s.block_size)
        return ids, np.zeros_like(ids), None

    def num_batches(self) -> int:
        return len(self.train[0]) // self.s.batch_size

    def _arrays(self, data, rows: np.ndarray, rng: np.random.Generator) -> tuple:
        ids, segments, is_next = data
        batch = ids[rows]
        m = mask_tokens(batch, rng, self.specials, self.tok.vocab_size, self.tok.mask_id, self.s.mask_rate, self.slots)
        arrays = (m.inputs, (batch != self.tok.pad_id).astype(np.int32), m.positions, m.labels, m.weights, segments[rows])
        return arrays + ((is_next[rows],) if is_next is not None else ())

    def batch(self, epoch: int, index: int, step: int) -> Batch:
        order = np.random.default_rng([self.s.seed, epoch]).permutation(len(self.train[0]))
        rows = order[index * self.s.batch_size : (index + 1) * self.s.batch_size]
        rng = np.random.default_rng([self.s.seed, epoch, index])  # masks re-drawn every batch
        arrays = self._arrays(self.train, rows, rng)
        return Batch(arrays, int(arrays[1].sum()), len(rows))

    def loss(self, model: Bert2Bert, inputs, mask, positions, labels, weights, segments, nsp_labels=None):
        return mlm_loss(model, inputs, mask, positions, labels, weights, segments, nsp_labels)

    def train_metrics(self, aux) -> dict[str, float]:
        mlm, n, correct, nsp_loss, nsp_correct = aux
        out = {"train/mlm_loss": float(mlm), "train/accuracy": float(correct / max(n, 1))}
        if self.s.nsp:
            out.update({"train/nsp_loss": float(nsp_loss), "train/nsp_accuracy": float(nsp_correct / self.s.batch_size)})
        return out

    def evaluate(self, model: Bert2Bert, step: int, writer: MetricWriter) -> dict[str, float]:
        """Fixed masks (seeded) over the first val_batches batches: comparable across steps."""
        rng = np.random.default_rng([self.s.seed, 12345])
        total = {"loss": 0.0, "n": 0.0, "correct": 0.0, "nsp": 0.0, "nsp_correct": 0.0, "examples": 0}
        n_val = len(self.val[0])
        for start in range(0, min(n_val, self.s.val_batches * self.s.batch_size), self.s.batch_size):
            rows = np.arange(start, min(start + self.s.batch_size, n_val))
            arrays = [mx.array(a) for a in self._arrays(self.val, rows, rng)]
            _, (loss, n, correct, nsp_loss, nsp_correct) = self.loss(model, *arrays)
            n = n.item()
            total["loss"] += loss.item() * n
            total["n"] += n
            total["correct"] += correct.item()
            total["nsp"] += nsp_loss.item() * len(rows)
            total["nsp_correct"] += nsp_correct.item()
            total["examples"] += len(rows)
        loss = total["loss"] / max(total["n"], 1)
        out = {"val/loss": loss, "val/accuracy": total["correct"] / max(total["n"], 1), "val/perplexity": math.exp(min(loss, 50))}
        if self.s.nsp:
            out["val/nsp_loss"] = total["nsp"] / max(total["examples"], 1)
            out["val/nsp_accuracy"] = total["nsp_correct"] / max(total["examples"], 1)
        return out


def main(argv: list[str] | None = None) -> int:
    return run_command(PretrainSettings, lambda s, tok, model: MLMTask(s, tok), argv, "MLM (+NSP) pretraining of the b2b BERT encoder.")


if __name__ == "__main__":
    sys.exit(main())
