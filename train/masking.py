"""BERT's masked-language-model corruption, done on the host in numpy (cheap, re-drawn every batch)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class MaskedBatch:
    inputs: np.ndarray  # (B, T) corrupted ids
    positions: np.ndarray  # (B, P) indices of the chosen tokens (padded with 0)
    labels: np.ndarray  # (B, P) original ids at those positions
    weights: np.ndarray  # (B, P) 1.0 for real predictions, 0.0 for padding slots


def max_predictions(block_size: int, rate: float = 0.15) -> int:
    """Fixed prediction slots per sequence, so the compiled step sees one shape."""
    return max(1, int(np.ceil(rate * block_size)))


def mask_tokens(
    ids: np.ndarray,
    rng: np.random.Generator,
    special_ids: set[int] | list[int],
    vocab_size: int,
    mask_id: int,
    rate: float = 0.15,
    num_slots: int | None = None,
) -> MaskedBatch:
    """Choose `rate` of each sequence's real tokens (never specials or padding); replace 80% of
    them with [MASK], 10% with a random token, keep 10%. Returns the gather positions so the
    vocabulary projection runs only where there is something to predict."""
    B, T = ids.shape
    P = num_slots or max_predictions(T, rate)
    candidates = ~np.isin(ids, list(special_ids))
    inputs = ids.copy()
    positions = np.zeros((B, P), dtype=np.int32)
    labels = np.zeros((B, P), dtype=np.int32)
    weights = np.zeros((B, P), dtype=np.float32)
    for b in range(B):
        cand = np.flatnonzero(candidates[b])
        if cand.size == 0:
            continue
        n = min(P, max(1, int(round(rate * cand.size))))
        chosen = np.sort(rng.choice(cand, size=n, replace=False))
        action = rng.random(n)
        inputs[b, chosen[action < 0.8]] = mask_id
        rand = chosen[(action >= 0.8) & (action < 0.9)]
        inputs[b, rand] = rng.integers(999, vocab_size, size=rand.size)  # 999+: skip [unused] ids
        positions[b, :n], labels[b, :n], weights[b, :n] = chosen, ids[b, chosen], 1.0
    return MaskedBatch(inputs, positions, labels, weights)
