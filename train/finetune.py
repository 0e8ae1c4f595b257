"""Summarization fine-tuning of BERT2BERT (or BERTShare with --share).

    python -m train.finetune --init ../shared/models/minilm-l6-h384-uncased \\
        --data ../shared/data/cnndm/train.jsonl.gz --val-data ../shared/data/cnndm/val.jsonl.gz --out logs/cnndm
"""
from __future__ import annotations

import logging
import sys
from dataclasses import dataclass, field
from typing import ClassVar

import mlx.core as mx
import numpy as np

from b2b import Bert2Bert, Tokenizer

from .batching import bucketed_batches, collate, collate_targets
from .data import end_sentences, folder_has_split, load_summarization_pairs, strip_update_labels, tokenize_pairs
from .evaluate import evaluate_rouge
from .command import run_command
from .loop import Batch
from .losses import reinforce_loss, seq2seq_loss
from .sampled import Sampler
from .settings import TrainSettings
from .writer import MetricWriter

log = logging.getLogger(__name__)


@dataclass
class FinetuneSettings(TrainSettings):
    RUN_IDENTITY: ClassVar[tuple[str, ...]] = TrainSettings.RUN_IDENTITY + (
        "data", "data_config", "val_data", "article_field", "summary_field", "limit", "max_source_len", "max_target_len", "share",
        "keep_update_labels", "keep_open_sentences", "pointer_generator", "rl_samples",
    )
    # Older runs kept "NEW:" and unended summary lines, and had no pointer-generator.
    BEFORE_IT_EXISTED: ClassVar[dict[str, object]] = {
        "keep_update_labels": True, "keep_open_sentences": True, "pointer_generator": False, "rl_weight": 0.0,
    }

    data: str = field(default="tests/fixtures/cnndm_tok_sample.jsonl.gz", metadata={"help": "JSONL/JSONL.GZ/CSV/Parquet, or a hub dataset name"})
    data_config: str = field(default="", metadata={"help": "hub dataset config, e.g. 3.0.0 for cnn_dailymail"})
    val_data: str = field(default="", metadata={"help": "validation pairs (default: the validation split of a --data folder, else 2%% of --data held out)"})
    article_field: str = field(default="article", metadata={"help": "field holding the article (JSONL key or CSV column)"})
    summary_field: str = field(default="highlights", metadata={"help": "field holding the reference summary: a string, or a list of sentences"})
    limit: int = field(default=0, metadata={"help": "use only the first N training pairs (0: all)"})
    max_source_len: int = field(default=512, metadata={"help": "article tokens kept (the rest is cut); recorded in each checkpoint's decoding.json"})
    max_target_len: int = field(default=128, metadata={"help": "summary tokens trained on (the rest is cut)"})
    keep_update_labels: bool = field(default=False, metadata={"help": 'keep CNN\'s "NEW:" label at the start of training summary lines (removed by default: 8%% of CNN/DM\'s training pairs have one, its test set none)'})
    keep_open_sentences: bool = field(default=False, metadata={"help": "leave training summary lines that end without . ! ? as they are (by default they get a full stop: 5%% of CNN/DM's training highlights end on a closing quote, and a model trained on them runs sentences together)"})
    share: bool = field(default=False, metadata={"help": "BERTShare: the decoder reuses the encoder's weights"})
    pointer_generator: bool = field(default=False, metadata={"help": "add a pointer-generator (copying source tokens, See et al. 2017) to a model that has none; its copy attention starts from the last cross-attention"})
    label_smoothing: float = field(default=0.0, metadata={"help": "share of each target's probability spread over the vocabulary (0: off; 0.1 is common)"})
    coverage: float = field(default=0.0, metadata={"help": "weight of See et al.'s coverage loss on the pointer's copy attention (pointer-generator models; 0: off; they used 1)"})
    rl_weight: float = field(default=0.0, metadata={"help": "share of the loss given to REINFORCE on summaries the model samples itself, rewarded by ROUGE-2 + ROUGE-Lsum (train/sampled.py; 0: off, the token loss alone)"})
    rl_samples: int = field(default=2, metadata={"help": "with --rl-weight: summaries sampled per article; each one's baseline is the mean reward of the others"})
    rl_temperature: float = field(default=1.0, metadata={"help": "with --rl-weight: sampling temperature of those summaries"})
    val_examples: int = field(default=200, metadata={"help": "validation pairs for val/loss"})
    rouge_examples: int = field(default=50, metadata={"help": "validation articles summarized for ROUGE (0: none)"})
    eval_num_beams: int = field(default=1, metadata={"help": "beams for the validation ROUGE summaries (1: greedy, fastest)"})
    samples: int = field(default=3, metadata={"help": "sample summaries written as text at each evaluation"})
    lr: float = 5e-5
    batch_size: int = 8
    out: str = "logs/finetune"

    def validate(self) -> None:
        super().validate()
        if self.coverage < 0:
            raise ValueError(f"--coverage must be >= 0 (0: off), got {self.coverage}.")
        if not 0 <= self.rl_weight <= 1:
            raise ValueError(f"--rl-weight must be in [0, 1] (0: off), got {self.rl_weight}.")
        if self.rl_weight and (self.rl_samples < 2 or self.rl_temperature <= 0):
            raise ValueError("--rl-samples must be at least 2 and --rl-temperature positive with --rl-weight.")
        if self.rouge_examples < 0 or self.val_examples < 1:
            raise ValueError("--rouge-examples must be >= 0 and --val-examples >= 1.")
        if self.limit < 0:
            raise ValueError("--limit cannot be negative (0: all pairs).")
        if self.max_source_len < 3 or self.max_target_len < 3:
            raise ValueError("--max-source-len and --max-target-len must be at least 3 ([CLS], a token, [SEP]).")

    def check_resume(self, saved: dict) -> None:
        super().check_resume(saved)
        # The best checkpoint is picked by val/rouge2 with ROUGE examples, else by val/loss.
        if "rouge_examples" in saved and bool(saved["rouge_examples"]) != bool(self.rouge_examples):
            raise ValueError(
                f"--resume cannot switch --rouge-examples between 0 and a positive number (the run in {self.out} "
                f"used {saved['rouge_examples']}): that changes the metric its best checkpoint was chosen by."
            )


class SummarizationTask:
    name = "summarization"
    higher_is_better = True
    aux_counts = (1,)  # seq2seq_loss: (token NLL, scored tokens, coverage loss)

    def __init__(self, s: FinetuneSettings, tokenizer: Tokenizer, max_positions: int):
        self.s, self.tok = s, tokenizer
        src_len = min(s.max_source_len, max_positions)
        tgt_len = min(s.max_target_len, max_positions)
        fields = dict(article_field=s.article_field, summary_field=s.summary_field, config=s.data_config or None)
        data = load_summarization_pairs(s.data, split="train", limit=s.limit or None, **fields)
        val_source = s.val_data or (s.data if folder_has_split(s.data, "validation", pairs=True) else "")
        if val_source:
            val = load_summarization_pairs(val_source, split="validation", limit=max(s.val_examples, s.rouge_examples), **fields)
            log.info("Validation: %d pairs from %s.", len(val), val.source)
        else:
            cut = max(1, len(data) * 2 // 100)
            val = type(data)(data.articles[-cut:], data.summaries[-cut:], 0, data.source)
            data = type(data)(data.articles[:-cut], data.summaries[:-cut], data.skipped_empty, data.source)
            log.info("Validation: the last %d pairs of %s, held out from training (no --val-data, no validation split).", cut, data.source)
        if not s.keep_update_labels and (changed := strip_update_labels(data)):
            log.info('Removed CNN\'s "NEW:" label from %d training summaries (--keep-update-labels keeps it).', changed)
        if not s.keep_open_sentences and (changed := end_sentences(data)):
            log.info("Ended a line with a full stop in %d training summaries (--keep-open-sentences keeps them).", changed)
        self.train = tokenize_pairs(data, tokenizer, src_len, tgt_len)
        self.train_summaries = data.summaries  # REINFORCE's references
        self.sampler = Sampler(tokenizer, s.rl_samples, s.rl_temperature, tgt_len - 2) if s.rl_weight else None
        self.model: Bert2Bert | None = None  # the model in training: REINFORCE samples from it
        self._rewards: list[float] = []
        self.val = tokenize_pairs(val, tokenizer, src_len, tgt_len)
        self.val_text = val
        self.src_len, self.tgt_len = src_len, tgt_len
        self.metric = "val/rouge2" if s.rouge_examples else "val/loss"
        self.higher_is_better = bool(s.rouge_examples)
        self._epoch_batches: tuple[int, list[np.ndarray]] | None = None
        self._lead3: dict[str, float] | None = None  # the articles never change: scored once

    def prepare(self, model: Bert2Bert) -> None:
        """Summarization trains every weight."""
        if self.s.coverage and "pointer" not in model:
            raise ValueError("--coverage is a loss on the pointer's copy attention: add --pointer-generator (or start from a pointer model).")
        model.unfreeze()
        self.model = model
        model.trained_source_length = self.src_len  # saved with every checkpoint: decoding reads as much

    def _batches(self, epoch: int) -> list[np.ndarray]:
        if self._epoch_batches is None or self._epoch_batches[0] != epoch:
            lengths = self.train.source_lengths
            self._epoch_batches = (epoch, bucketed_batches(lengths, self.s.batch_size, self.s.seed, epoch, drop_last=True))
        return self._epoch_batches[1]

    def num_batches(self) -> int:
        return len(self._batches(0))

    def _collate(self, data, rows) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        # Multiples of 32/16: few distinct shapes, so the compiled step is reused.
        src = collate([data.sources[i] for i in rows], self.tok.pad_id, pad_to_multiple=32)
        tgt = collate_targets([data.targets[i] for i in rows], self.tok.pad_id)
        return src, (src != self.tok.pad_id).astype(np.int32), tgt

    def batch(self, epoch: int, index: int, step: int) -> Batch:
        rows = self._batches(epoch)[index]
        src, mask, tgt = self._collate(self.train, rows)
        tokens = int(mask.sum() + (tgt != self.tok.pad_id).sum())
        if self.sampler is None:
            return Batch((src, mask, tgt), tokens, len(rows))
        # Sampled with the weights of this step, seeded by it: a resumed run draws the same.
        drawn = self.sampler(self.model, src, mask, [self.train_summaries[i] for i in rows], hash((self.s.seed, step, 7919)) % (2**31))
        self._rewards.append(float(drawn.rewards.mean()))
        return Batch((src, mask, tgt, drawn.samples, drawn.advantages), tokens + drawn.tokens, len(rows))

    def loss(self, model: Bert2Bert, src, mask, tgt, samples=None, advantages=None):
        if samples is None:
            return seq2seq_loss(model, src, mask, tgt, self.s.label_smoothing, self.s.coverage)
        return reinforce_loss(model, src, mask, tgt, samples, advantages, self.s.rl_weight, self.s.label_smoothing, self.s.coverage)

    def train_metrics(self, aux) -> dict[str, float]:
        # With a coverage loss or REINFORCE, train/loss is a mix: its parts are logged apart.
        metrics = {"train/nll": float(aux[0])} if self.s.coverage or self.sampler else {}
        if self.s.coverage:
            metrics["train/coverage"] = float(aux[2])
        if self.sampler is not None:
            metrics.update({"train/rl_loss": float(aux[3]), "train/reward": float(np.mean(self._rewards or [0.0]))})
            self._rewards = []
        return metrics

    def evaluate(self, model: Bert2Bert, step: int, writer: MetricWriter) -> dict[str, float]:
        total, count = 0.0, 0.0
        n_val = min(len(self.val), self.s.val_examples)
        order = np.argsort(self.val.source_lengths[:n_val], kind="stable")
        for start in range(0, n_val, self.s.batch_size):
            rows = order[start : start + self.s.batch_size]
            src, mask, tgt = (mx.array(a) for a in self._collate(self.val, rows))
            _, (loss, n, _) = seq2seq_loss(model, src, mask, tgt)  # no smoothing, no coverage: comparable losses
            total += loss.item() * n.item()
            count += n.item()
        metrics = {"val/loss": total / max(count, 1.0)}
        k = min(self.s.rouge_examples, len(self.val_text))
        if k:
            report = evaluate_rouge(
                model, self.tok, self.val_text.articles[:k], self.val_text.summaries[:k], self.s.batch_size,
                num_beams=self.s.eval_num_beams, max_length=self.tgt_len, max_source_length=self.src_len,
                lead3_scores=self._lead3,
            )
            if self._lead3 is None:
                self._lead3 = report.lead3
                log.info("Lead-3 on the %d ROUGE articles: %s.", k, ", ".join(f"{n}={v:.2f}" for n, v in report.lead3.items()))
            metrics.update({f"val/{k2}": v for k2, v in report.model.items()})
            samples = "\n\n".join(
                f"**Reference:** {r['reference']}\n\n**Generated:** {r['generated']}" for r in report.rows[: self.s.samples]
            )
            writer.text("val/samples", samples, step)
        return metrics


def main(argv: list[str] | None = None) -> int:
    return run_command(FinetuneSettings, lambda s, tok, model: SummarizationTask(s, tok, model.config.max_positions), argv, "Fine-tune BERT2BERT for summarization.")


if __name__ == "__main__":
    sys.exit(main())
