"""Pointer-generator copying (See et al. 2017) on top of the BERT2BERT decoder.

A small model writes names and numbers badly: "albert maysles" is four WordPieces it must
produce from the vocabulary softmax, and it often writes a wrong but likely name instead. With
the pointer, each step's distribution mixes the vocabulary softmax with a copy distribution
over the source's tokens:

    p(w) = g * p_vocab(w) + (1 - g) * sum_{i : src_i = w} a_i

where a (over source positions) is one attention from the decoder's final state to the encoder
states, and the gate g = sigmoid(w . [h; a @ memory] + b) decides how much to copy.
Shapes: B batch, S source length, T target length, C hidden, V vocabulary, R decoding rows.
"""
from __future__ import annotations

import math

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from .config import B2BConfig
from .layers import Linear

_NEG = -1e9  # a finite "minus infinity": a source with nothing to copy gives zero weights, not NaN
# Added to a label's copy mass in training: log(0) would make the gradient NaN (0 * inf).
_TINY = 1e-12
_NOTHING_TO_COPY = 50.0  # the gate logit where the source holds no copyable token: all from the vocabulary
_GATE_BIAS = 2.0  # a fresh head starts copying little (g ~ 0.88): the decoder it joins already writes


def copyable(src_ids: mx.array, cfg: B2BConfig) -> mx.array:
    """(B, S) bool: source positions the pointer may copy from (not [PAD], [CLS] or [SEP]:
    the summary's end comes from the vocabulary)."""
    return (src_ids != cfg.pad_id) & (src_ids != cfg.cls_id) & (src_ids != cfg.sep_id)


class PointerGenerator(nn.Module):
    """The copy attention (one head over the full hidden size) and the copy gate."""

    def __init__(self, cfg: B2BConfig):
        super().__init__()
        C = cfg.hidden_size
        self.query = Linear(C, C)
        self.key = Linear(C, C)
        self.gate = Linear(2 * C, 1)
        # The scale of one head of the cross-attention it is warm-started from (`warm_start`):
        # its scores start as the sum of that layer's heads' scores.
        self.scale = 1.0 / math.sqrt(cfg.head_dim)

    def keys(self, memory: mx.array) -> mx.array:
        """Encoder states (B, S, C) -> copy-attention keys (B, S, C), once per input."""
        return self.key(memory)

    def __call__(
        self, h: mx.array, keys: mx.array, memory: mx.array, allowed: mx.array
    ) -> tuple[mx.array, mx.array]:
        """Copy weights (B, T, S) and gate logits (B, T) for decoder states h (B, T, C);
        `allowed` (B, S) bool from `copyable`. sigmoid(gate logit) is the vocabulary's share."""
        scores = (self.query(h) * self.scale) @ keys.transpose(0, 2, 1)  # (B, T, S)
        scores = mx.where(allowed[:, None, :], scores.astype(mx.float32), _NEG)
        weights = mx.softmax(scores, axis=-1) * allowed[:, None, :]  # (B, T, S)
        context = weights.astype(memory.dtype) @ memory  # (B, T, C)
        gate = self.gate(mx.concatenate([h, context], axis=-1))[..., 0].astype(mx.float32)  # (B, T)
        return weights, mx.where(allowed.any(axis=-1, keepdims=True), gate, _NOTHING_TO_COPY)

    def warm_start(self, cross_query: nn.Linear, cross_key: nn.Linear) -> None:
        """Start from a cross-attention's projections (the last decoder layer's): the pointer
        then attends like the sum of its heads instead of uniformly, and the gate starts
        favouring the vocabulary."""
        self.query.update(cross_query.parameters())
        self.key.update(cross_key.parameters())
        self.gate.weight = mx.zeros_like(self.gate.weight)
        self.gate.bias = mx.full(self.gate.bias.shape, _GATE_BIAS)


def label_nll(
    vocab_nll: mx.array, weights: mx.array, gate: mx.array, src_ids: mx.array, labels: mx.array
) -> mx.array:
    """-log p(label) under the mixture, (B, T), from the vocabulary's -log p_vocab(label)
    (B, T), copy weights (B, T, S), gate logits (B, T), source ids (B, S) and labels (B, T).
    Only the labels' copy mass is formed: no (B, T, V) array."""
    hits = src_ids[:, None, :] == labels[:, :, None]  # (B, T, S)
    copy_mass = (weights * hits).sum(axis=-1)  # (B, T)
    from_vocab = nn.log_sigmoid(gate) - vocab_nll
    from_copy = nn.log_sigmoid(-gate) + mx.log(copy_mass + _TINY)
    return -mx.logaddexp(from_vocab, from_copy)


def mix_log_probs(vocab_log_probs: mx.array, weights: mx.array, gate: mx.array, src_ids: mx.array) -> mx.array:
    """The mixture's log-probabilities (B, T, V) from the vocabulary's (B, T, V), copy weights
    (B, T, S), gate logits (B, T) and source ids (B, S): the reference the decoding steps'
    `CopyMixer` is tested against (it forms a (B, T, V) array: for short inputs only)."""
    B, T, V = vocab_log_probs.shape
    rows = mx.arange(B)[:, None, None]
    steps = mx.arange(T)[None, :, None]
    mass = mx.zeros((B, T, V), mx.float32).at[rows, steps, src_ids[:, None, :]].add(weights.astype(mx.float32))
    from_vocab = nn.log_sigmoid(gate)[..., None] + vocab_log_probs.astype(mx.float32)
    from_copy = nn.log_sigmoid(-gate)[..., None] + mx.log(mass)  # -inf where the source lacks the token
    return mx.logaddexp(from_vocab, from_copy)


def _log_sigmoid(x: np.ndarray) -> np.ndarray:
    return -np.logaddexp(0.0, -x)


class CopyMixer:
    """A decoding run's copy step on the host (in C where cpu_step is built, else in NumPy):
    the source's copy keys are projected once per input; each step turns the vocabulary's
    log-probabilities (R, V) and the decoder's final states (R, C) into the mixture's
    log-probabilities, touching only the tokens the source holds. Row r belongs to input
    r // beams. With `keep_weights`, each step's copy weights (R, S) are left in `weights`
    (beam search's coverage penalty reads them)."""

    def __init__(self, model, memory: mx.array, src_ids: mx.array, beams: int, keep_weights: bool = False):
        from . import cpu_step  # (cpu_step imports the model, which imports this module)

        self._mix_in_c = cpu_step.copy_mix
        head: PointerGenerator = model.pointer
        f32 = lambda a: np.ascontiguousarray(np.asarray(a.astype(mx.float32)))  # noqa: E731
        self.keys = f32(head.keys(memory) * head.scale)  # (B, S, C), the scale folded in
        self.memory = f32(memory)  # (B, S, C)
        self.wq, self.bq = f32(head.query.weight), f32(head.query.bias)  # (C, C) as (out, in), (C,)
        self.wg, self.bg = f32(head.gate.weight)[0].copy(), float(f32(head.gate.bias)[0])  # (2C,), ()
        ids = np.asarray(src_ids)
        allowed = np.asarray(copyable(src_ids, model.config))
        self.beams = beams
        self.keep_weights = keep_weights
        self.weights: np.ndarray | None = None
        # Per input: its distinct copyable tokens (B, U) (-1 after the last), and which of them
        # each position holds (B, S) (-1: not copyable).
        found = [np.unique(ids[b][allowed[b]], return_inverse=True) for b in range(ids.shape[0])]
        U = max([len(u) for u, _ in found] + [1])
        self.tokens = np.full((ids.shape[0], U), -1, np.int32)
        self.slot = np.full(ids.shape, -1, np.int32)
        for b, (uniq, inverse) in enumerate(found):
            self.tokens[b, : len(uniq)] = uniq
            self.slot[b, allowed[b]] = inverse

    def __call__(self, log_probs: np.ndarray, h: np.ndarray) -> np.ndarray:
        """Mix in place and return `log_probs` (R, V) (C-contiguous float32) for final decoder
        states h (R, C): in C on MLX's CPU backend (cpu_step.copy_mix), else in NumPy."""
        h = np.ascontiguousarray(h, dtype=np.float32)
        if self.keep_weights and (self.weights is None or self.weights.shape[0] != h.shape[0]):
            # One buffer for the run: every step overwrites every row (the reader copies it first).
            self.weights = np.empty((h.shape[0], self.slot.shape[1]), np.float32)
        args = (self.wq, self.bq, self.keys, self.memory, self.wg, self.bg, self.slot, self.tokens, _NOTHING_TO_COPY)
        if not self._mix_in_c(log_probs, h, *args, self.weights):
            self._mix_numpy(log_probs, h)
        return log_probs

    def _mix_numpy(self, log_probs: np.ndarray, h: np.ndarray) -> None:
        q = h @ self.wq.T + self.bq  # (R, C)
        C = h.shape[1]
        for b in range(self.keys.shape[0]):
            rows = slice(b * self.beams, (b + 1) * self.beams)
            allowed = self.slot[b] >= 0
            scores = np.where(allowed, q[rows] @ self.keys[b].T, -np.inf)  # (K, S)
            if allowed.any():
                weights = np.exp(scores - scores.max(axis=-1, keepdims=True))
                weights /= weights.sum(axis=-1, keepdims=True)
            else:
                weights = np.zeros_like(scores)
            if self.weights is not None:
                self.weights[rows] = weights
            context = weights @ self.memory[b]  # (K, C)
            gate = h[rows] @ self.wg[:C] + context @ self.wg[C:] + self.bg  # (K,)
            if not allowed.any():
                gate[:] = _NOTHING_TO_COPY
            out = log_probs[rows]  # a view: changed in place
            out += _log_sigmoid(gate)[:, None]
            uniq = self.tokens[b][self.tokens[b] >= 0]
            if len(uniq):
                mass = np.zeros((weights.shape[0], len(uniq)), np.float64)
                for k in range(weights.shape[0]):
                    mass[k] = np.bincount(self.slot[b][allowed], weights=weights[k][allowed], minlength=len(uniq))
                with np.errstate(divide="ignore"):
                    copied = _log_sigmoid(-gate)[:, None] + np.log(mass)
                out[:, uniq] = np.logaddexp(out[:, uniq], copied)
