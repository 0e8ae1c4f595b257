"""Batches for training: length-bucketed, shuffled index batches that a resumed run can
replay exactly, and padding into (B, T) int32 arrays. numpy only."""
from __future__ import annotations

from typing import Iterator, Sequence

import numpy as np


def _length_sorted_chunks(lengths: np.ndarray, chunk: int, rng: np.random.Generator) -> Iterator[np.ndarray]:
    """Shuffled indices cut into chunks of `chunk`, each sorted by length: similar lengths share
    a batch (little padding) while the data order stays random at the scale of chunks."""
    order = rng.permutation(len(lengths))
    for start in range(0, len(order), chunk):
        part = order[start : start + chunk]
        yield part[np.argsort(lengths[part], kind="stable")]


def bucketed_batches(
    lengths: np.ndarray,
    batch_size: int,
    seed: int,
    epoch: int,
    bucket_size_multiplier: int = 50,
    drop_last: bool = False,
) -> list[np.ndarray]:
    """Batches of indices, deterministic for (seed, epoch) so a resumed run can skip to batch
    k of epoch e and see the same data. Every index appears once (unless `drop_last` drops
    the short batches)."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be positive, got {batch_size}.")
    lengths = np.asarray(lengths)
    rng = np.random.default_rng([seed, epoch])
    batches = [
        sorted_chunk[i : i + batch_size]
        for sorted_chunk in _length_sorted_chunks(lengths, batch_size * bucket_size_multiplier, rng)
        for i in range(0, len(sorted_chunk), batch_size)
    ]
    if drop_last:
        batches = [b for b in batches if len(b) == batch_size]
    return [batches[k] for k in rng.permutation(len(batches))]


def collate(seqs: Sequence[np.ndarray], pad_id: int, pad_to_multiple: int = 8) -> np.ndarray:
    """(B, T) int32, right-padded with `pad_id`; T is rounded up to a multiple of
    `pad_to_multiple` so the compiled step sees few distinct shapes."""
    if not len(seqs):
        raise ValueError("collate needs at least one sequence.")
    longest = max(len(s) for s in seqs)
    width = max(pad_to_multiple, -(-longest // pad_to_multiple) * pad_to_multiple)
    out = np.full((len(seqs), width), pad_id, dtype=np.int32)
    for row, s in zip(out, seqs):
        row[: len(s)] = s
    return out  # (B, T)


def collate_targets(seqs: Sequence[np.ndarray], pad_id: int) -> np.ndarray:
    """Summaries ([CLS] ... [SEP]) as the seq2seq losses take them: (B, 16k + 1) int32, padded
    to a multiple of 16 plus one column, so that dropping the first or the last column (decoder
    input, labels) leaves a multiple of 16 and the compiled step sees few shapes."""
    out = collate(seqs, pad_id, pad_to_multiple=16)
    return np.concatenate([out, np.full((len(out), 1), pad_id, np.int32)], axis=1)
