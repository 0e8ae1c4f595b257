"""Tests for train/masking.py: BERT's 15% / 80-10-10 corruption, checked statistically."""
from __future__ import annotations

import math

import numpy as np

from train.masking import mask_tokens, max_predictions

PAD, UNK, CLS, SEP, MASK = 0, 100, 101, 102, 103
SPECIALS = {PAD, UNK, CLS, SEP, MASK}
VOCAB = 30522


def random_batch(rng: np.random.Generator, B: int = 512, T: int = 128) -> np.ndarray:
    """`[CLS] words (some [UNK]) [SEP] [PAD]...` rows of random lengths, like packed MLM blocks."""
    ids = rng.integers(999, VOCAB, size=(B, T)).astype(np.int32)
    ids[rng.random((B, T)) < 0.02] = UNK
    lengths = rng.integers(T // 4, T + 1, size=B)
    for row, n in zip(ids, lengths):
        row[0], row[n - 1], row[n:] = CLS, SEP, PAD
    return ids


def within(observed: int, n: int, p: float, sigmas: float = 5.0) -> bool:
    """`observed` successes out of `n` is within `sigmas` binomial standard deviations of n*p."""
    return abs(observed - n * p) <= sigmas * math.sqrt(n * p * (1 - p))


def test_mask_statistics():
    ids = random_batch(np.random.default_rng(0))
    m = mask_tokens(ids, np.random.default_rng(1), SPECIALS, VOCAB, MASK)
    B, T = ids.shape
    P = max_predictions(T)
    assert m.inputs.shape == ids.shape and m.positions.shape == m.labels.shape == m.weights.shape == (B, P)

    real = ~np.isin(ids, list(SPECIALS))
    chosen = np.zeros_like(real)
    n_real = real.sum(axis=1)
    for b in range(B):
        pos = m.positions[b][m.weights[b] > 0]
        assert len(set(pos.tolist())) == len(pos), "a position chosen twice"
        chosen[b, pos] = True
        # ~15% of each row's real tokens (rounded; the slots never cut it short here).
        assert len(pos) == max(1, round(0.15 * n_real[b]))
    # Never a special token or padding, and labels are the original ids.
    assert not (chosen & ~real).any()
    assert np.array_equal(np.take_along_axis(ids, m.positions, axis=1)[m.weights > 0], m.labels[m.weights > 0])
    assert (m.labels[m.weights == 0] == 0).all()
    assert abs(chosen.sum() / real.sum() - 0.15) < 0.005
    # Tokens that were not chosen are untouched.
    assert np.array_equal(m.inputs[~chosen], ids[~chosen])

    n = int(chosen.sum())
    before, after = ids[chosen], m.inputs[chosen]
    masked = int((after == MASK).sum())
    kept = int((after == before).sum())
    randomized = n - masked - kept
    assert within(masked, n, 0.8), (masked, n)
    assert within(randomized, n, 0.1), (randomized, n)
    assert within(kept, n, 0.1), (kept, n)
    # Random replacements are ordinary words, never a special or an [unused] id.
    replaced = after[(after != MASK) & (after != before)]
    assert replaced.min() >= 999 and replaced.max() < VOCAB


def test_masks_depend_on_the_rng():
    ids = random_batch(np.random.default_rng(0), B=64)
    a = mask_tokens(ids, np.random.default_rng(1), SPECIALS, VOCAB, MASK)
    same = mask_tokens(ids, np.random.default_rng(1), SPECIALS, VOCAB, MASK)
    other = mask_tokens(ids, np.random.default_rng(2), SPECIALS, VOCAB, MASK)
    assert np.array_equal(a.positions, same.positions) and np.array_equal(a.inputs, same.inputs)
    assert not np.array_equal(a.positions, other.positions)
    # Most rows get different positions, not just one.
    assert (a.positions != other.positions).any(axis=1).mean() > 0.9


def test_rows_without_real_tokens_get_no_predictions():
    ids = np.array([[CLS, SEP, PAD, PAD], [CLS, 2000, SEP, PAD]], dtype=np.int32)
    m = mask_tokens(ids, np.random.default_rng(0), SPECIALS, VOCAB, MASK, num_slots=2)
    assert m.weights.tolist() == [[0, 0], [1, 0]]
    assert m.positions[1, 0] == 1 and m.labels[1, 0] == 2000
    assert np.array_equal(m.inputs[0], ids[0])
