"""Summaries the model samples of its training articles, rewarded by ROUGE, for REINFORCE
(`train.finetune --rl-weight`).

Teacher forcing trains each next token given the reference's prefix; ROUGE scores whole
summaries the model wrote itself. Here each article gets K sampled summaries (with the same
bans on repeats and the same source spelling as decoding's defaults), each rewarded by the mean of its ROUGE-2 and ROUGE-Lsum F1
against the reference (the scores the issue's targets name, by `b2b.rouge`, the app's scorer).
A sample's baseline is the mean reward of the article's other samples (Kool et al. 2019,
"Buy 4 REINFORCE samples, get a baseline for free!"): no greedy decode per article, and an
advantage is positive only where a sample beat its siblings. Advantages are divided by their
standard deviation over the batch, so `--rl-weight` sets the balance with the token loss
whatever the reward's scale.
"""
from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from b2b import Bert2Bert, Tokenizer
from b2b.decoding import DecodingConfig, WordPieces
from b2b.generate import generate
from b2b.rouge import rouge_scores

from .batching import collate_targets

REWARD = ("rouge2", "rougeLsum")


@dataclass
class SampledBatch:
    samples: np.ndarray  # (B, K, T) int32: [CLS] summary [SEP], padded; T-1 labels each
    advantages: np.ndarray  # (B, K) float32
    rewards: np.ndarray  # (B, K) float32 in [0, 1], for the log
    tokens: int  # sampled tokens, for tokens/s


def leave_one_out(rewards: np.ndarray) -> np.ndarray:
    """(B, K) rewards -> each one less the mean of its row's other K-1 (K >= 2)."""
    k = rewards.shape[1]
    return (rewards - (rewards.sum(axis=1, keepdims=True) - rewards) / (k - 1)).astype(np.float32)


def standardize(advantages: np.ndarray) -> np.ndarray:
    """Divided by their standard deviation (not re-centred: leave-one-out already is); all
    zero when every sample scored the same."""
    std = float(advantages.std())
    return (advantages / std if std > 1e-8 else np.zeros_like(advantages)).astype(np.float32)


class Sampler:
    """Draws `k` summaries per article at `temperature` and rewards them."""

    def __init__(self, tokenizer: Tokenizer, k: int, temperature: float, max_length: int):
        if k < 2:
            raise ValueError(f"REINFORCE needs at least 2 samples per article (each one's baseline is the others'), got {k}.")
        self.tok, self.k, self.temperature, self.max_length = tokenizer, k, temperature, max_length
        self.words = WordPieces.of(tokenizer)

    def __call__(self, model: Bert2Bert, src: np.ndarray, mask: np.ndarray, references: list, seed: int) -> SampledBatch:
        """`src`, `mask` (B, S) as the loss gets them; `references[b]` a reference summary (a str
        or a list of sentences). Decodes in eval mode (no dropout)."""
        cfg = DecodingConfig(max_length=self.max_length, do_sample=True, temperature=self.temperature, seed=seed)
        rows = lambda a: mx.array(np.repeat(a, self.k, axis=0))  # noqa: E731  article b's samples are rows b*k ... b*k+k-1
        hyps = generate(model, rows(src), rows(mask), cfg, self.words)
        c = model.config
        seqs = [np.array([c.cls_id, *h.tokens] + ([c.sep_id] if h.finish_reason == "eos" else []), np.int32) for h in hyps]
        texts = [self.tok.decode(h.tokens) for h in hyps]
        refs = [r for r in references for _ in range(self.k)]
        scores = rouge_scores(texts, refs).per_example
        rewards = np.array([sum(e[name] for name in REWARD) / (100.0 * len(REWARD)) for e in scores], np.float32)
        rewards = rewards.reshape(-1, self.k)
        samples = collate_targets(seqs, c.pad_id)
        return SampledBatch(
            samples.reshape(len(references), self.k, -1), standardize(leave_one_out(rewards)), rewards,
            sum(len(h.tokens) for h in hyps),
        )
