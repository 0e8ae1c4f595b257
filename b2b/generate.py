"""Decoding: greedy, sampling and beam search over a KV cache, batched over inputs and beams.

The encoder runs once per input; cross-attention keys/values are projected once into the cache
(beam rows are copies of their input's rows); each step feeds only the newest token."""
from __future__ import annotations

import os
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

import mlx.core as mx
import numpy as np

from . import cpu_step, fastmath
from .cache import DecoderCache, StaticLayerCache, StepPosition
from .decoding import DecodingConfig, DecodingError, WordPieces
from .model import Bert2Bert
from .pointer import CopyMixer
from .spelling import SourceSpelling, row_spellings

_OUTPUT_T = "_b2b_output_t"  # model attribute: (output matrix, its (C, V) copy) for decoding


@dataclass
class Hypothesis:
    tokens: list[int]  # generated ids, without the start token and without the final [SEP]
    finish_reason: str  # "eos" (the model ended it) or "length" (max_length reached)
    score: float = 0.0  # beam search: length-normalised log-probability, less any coverage penalty


@dataclass
class Step:
    """One decoding step, for streaming: the newest token and the best sequence so far per input."""

    tokens: list[list[int]]
    finished: list[bool]


def _banned_ngrams(history: list[int], n: int) -> list[int]:
    """Tokens that would complete an n-gram already present in `history`."""
    if n <= 0 or len(history) < n:
        return []
    prefix = tuple(history[len(history) - n + 1:]) if n > 1 else ()
    banned = []
    for i in range(len(history) - n + 1):
        if tuple(history[i:i + n - 1]) == prefix:
            banned.append(history[i + n - 1])
    return banned


def _penalize_repeats(logits: np.ndarray, histories: list[list[int]], penalty: float, start_id: int) -> np.ndarray:
    """transformers' repetition penalty: the score of each token a row already holds (its
    start token included, as transformers counts it) is divided by `penalty` when positive
    and multiplied by it when negative (beam search applies it to log-probabilities).
    Changes `logits` in place and returns it."""
    for r, hist in enumerate(histories):
        seen = np.array(sorted(set(hist) | {start_id}))
        picked = logits[r, seen]
        logits[r, seen] = np.where(picked < 0, picked * penalty, picked / penalty)
    return logits


def _spellings(cfg: DecodingConfig, words: WordPieces | None, src_ids: mx.array | None, beams: int = 1) -> list[SourceSpelling] | None:
    """Each row's `SourceSpelling`, or None when `cfg.source_spelling` is off or the word pieces
    or the source are missing."""
    on = cfg.source_spelling and words is not None and src_ids is not None
    return row_spellings(np.array(src_ids), words, beams) if on else None


def _apply_constraints(
    logits: np.ndarray, histories: list[list[int]], cfg: DecodingConfig, eos_id: int, start_id: int,
    words: WordPieces | None, spellings: list[SourceSpelling] | None = None,
) -> np.ndarray:
    """The repetition penalty, then bans as -inf logits: [SEP] before min_length, tokens that
    repeat an n-gram, a word following itself, and words the source does not spell
    (`spellings`, one per row). On the host, in place: a step's logits are read there anyway."""
    if cfg.repetition_penalty != 1.0:
        logits = _penalize_repeats(logits, histories, cfg.repetition_penalty, start_id)
    word_bans = cfg.no_repeat_word and words is not None
    for r, hist in enumerate(histories):
        banned = _banned_ngrams(hist, cfg.no_repeat_ngram_size)
        if word_bans:
            banned += words.banned(hist)
        if len(hist) < cfg.min_length:
            banned.append(eos_id)
        if banned:
            logits[r, banned] = -np.inf
        if spellings is not None:
            spellings[r].restrict(logits[r], hist)
    return logits


def _sample(logits: mx.array, cfg: DecodingConfig, key: mx.array) -> mx.array:
    """Draw one token per row from temperature-scaled, top-k / top-p filtered logits."""
    logits = logits / cfg.temperature
    if cfg.top_k and cfg.top_k < logits.shape[-1]:
        kth = mx.sort(logits, axis=-1)[:, -cfg.top_k][:, None]
        logits = mx.where(logits < kth, -mx.inf, logits)
    if cfg.top_p < 1.0:
        order = mx.argsort(-logits, axis=-1)
        sorted_logits = mx.take_along_axis(logits, order, axis=-1)
        probs = mx.softmax(sorted_logits, axis=-1)
        # Keep the smallest prefix whose mass reaches top_p (always at least the top token).
        drop_sorted = (mx.cumsum(probs, axis=-1) - probs) >= cfg.top_p
        drop = mx.put_along_axis(mx.zeros_like(drop_sorted), order, drop_sorted, axis=-1)
        logits = mx.where(drop, -mx.inf, logits)
    return mx.random.categorical(logits, key=key)


class _Stepper:
    """One decoding step for a batch of rows. In eval mode (and unless B2B_COMPILE_DECODE=0): on
    MLX's CPU backend with float32 weights, the step in C (`cpu_step`: one call instead of ~600
    kernels); otherwise a compiled MLX step over fixed-size self-attention buffers: one trace
    per (rows, source length, capacity) serves every position, so a token costs a few fused
    kernels instead of hundreds of separately dispatched ops. In training mode the growing
    `DecoderCache`. A model with a pointer returns log-probabilities of the mixture (`CopyMixer`
    on the host, from the step's final decoder states), whatever `log_probs` says."""

    def __init__(self, model: Bert2Bert, memory: mx.array, src_mask: mx.array | None, max_steps: int,
                 beams: int = 1, log_probs: bool = False, src_ids: mx.array | None = None, copy_weights: bool = False):
        self.copy = None
        if "pointer" in model:
            if src_ids is None:
                raise ValueError("A model with a pointer needs the source ids to decode.")
            self.copy = CopyMixer(model, memory, src_ids, beams, keep_weights=copy_weights)
            log_probs = True  # the mixture is a distribution: its logits are its log-probabilities
        self.model, self.log_probs = model, log_probs
        # Cross-attention K/V projected once per input and shared by its beams (rows b*beams + k):
        # `Attention` groups a step's rows by input when there are more rows than inputs.
        cache = model.make_cache(memory, src_mask)
        self.compiled = _compiles(model)
        self.in_c = None
        if not self.compiled:
            self.cache = cache
            return
        capacity = -(-max_steps // 32) * 32  # a few capacities: compiled steps are reused
        if cpu_step.applies(model):  # the same step in C: MLX's CPU kernels cost more to launch than to run
            cross = [layer.cross_kv for layer in cache.layers]
            self.in_c = cpu_step.CpuStepper(model, cross, cache.cross_mask, capacity, beams, log_probs)
            return
        c = model.config
        B, S = memory.shape[:2]
        R = B * beams
        shape = (R, c.num_heads, capacity, c.head_dim)
        self.keys = [mx.zeros(shape, memory.dtype) for _ in cache.layers]
        self.values = [mx.zeros(shape, memory.dtype) for _ in cache.layers]
        self.cross = [layer.cross_kv for layer in cache.layers]
        self.cross_mask = cache.cross_mask if cache.cross_mask is not None else mx.ones((B, 1, 1, S), dtype=mx.bool_)
        self.position = 0
        self.table_t = _output_matrix_t(model)  # (C, V)

    def __call__(self, tokens: mx.array, reorder: mx.array | None = None) -> np.ndarray:
        """Logits (or log-probabilities) (R, V), float32, a fresh host array, for the newest
        tokens (R, 1); `reorder` first keeps cache rows `reorder` (beam search)."""
        out, states = self._step(tokens, reorder)
        return self.copy(out, states) if self.copy is not None else out

    def _step(self, tokens: mx.array, reorder: mx.array | None) -> tuple[np.ndarray, np.ndarray | None]:
        """The vocabulary's logits or log-probabilities (R, V), and the final decoder states
        (R, C) when a pointer reads them."""
        if self.in_c is not None:
            states = np.empty((tokens.shape[0], self.model.config.hidden_size), np.float32) if self.copy else None
            return self.in_c(tokens, reorder, states), states
        if not self.compiled:
            if reorder is not None:
                self.cache.reorder(reorder)
            out, h = self.model.decode_step_states(tokens, self.cache)
            out = out.astype(mx.float32)
            out = np.array(fastmath.log_softmax(out) if self.log_probs else out)
            return out, np.array(h.astype(mx.float32)) if self.copy else None
        step = _compiled_step(self.model, reorder is not None, self.log_probs)
        extra = [reorder] if reorder is not None else []
        out, h, self.keys, self.values = step(tokens, mx.array(self.position, mx.int32), self.keys, self.values,
                                              self.cross, self.cross_mask, self.table_t, *extra)
        self.position += 1
        return np.array(out), np.array(h.astype(mx.float32)) if self.copy else None


def _compiles(model: Bert2Bert) -> bool:
    return os.environ.get("B2B_COMPILE_DECODE", "1") != "0" and not model.training


def _encode(model: Bert2Bert, src_ids: mx.array, src_mask: mx.array | None) -> tuple[mx.array, mx.array | None, mx.array]:
    """Encoder states (B, S', C) and the mask and ids that go with them. Compiled (one fused graph)
    when decoding compiles; the source is then padded to a multiple of 64 (masked, so the
    result is the same) so that a few traces serve every length."""
    if not _compiles(model):
        return model.encode(src_ids, src_mask), src_mask, src_ids
    B, S = src_ids.shape
    if src_mask is None:
        src_mask = mx.ones((B, S), dtype=mx.int32)
    width = min(-(-S // 64) * 64, max(S, model.config.max_positions))
    if width > S:
        pad = mx.zeros((B, width - S), dtype=src_ids.dtype)
        src_ids = mx.concatenate([src_ids, pad + model.config.pad_id], axis=1)
        src_mask = mx.concatenate([src_mask, pad.astype(src_mask.dtype)], axis=1)
    steps = model.__dict__.setdefault("_b2b_compiled_steps", {})
    key = ("encode", fastmath.enabled())
    if key not in steps:
        steps[key] = mx.compile(lambda ids, mask: model.encode(ids, mask), inputs=model.state)
    return steps[key](src_ids, src_mask), src_mask, src_ids


def _compiled_step(model: Bert2Bert, reorder: bool, log_probs: bool):
    """The model's compiled decoding step (made once per model and variant). Its weights are
    read afresh at every call (`inputs=model.state`), so later updates are seen."""
    steps = model.__dict__.setdefault("_b2b_compiled_steps", {})
    key = (reorder, log_probs, fastmath.enabled())
    if key not in steps:

        def step(tokens, position, keys, values, cross, cross_mask, table_t, *rows):
            if rows:
                keys, values = [k[rows[0]] for k in keys], [v[rows[0]] for v in values]
            at = StepPosition(position, keys[0].shape[2])
            layers = [StaticLayerCache(kv, k, v, at) for kv, k, v in zip(cross, keys, values)]
            out, h = model.decode_step_states(tokens, DecoderCache(layers, cross_mask), table_t)  # (R, V), (R, C)
            out = out.astype(mx.float32)
            if log_probs:
                out = fastmath.log_softmax(out)
            return out, h, [layer.keys for layer in layers], [layer.values for layer in layers]

        steps[key] = mx.compile(step, inputs=model.state)
    return steps[key]


def _output_matrix_t(model: Bert2Bert) -> mx.array:
    """A contiguous (C, V) copy of the output matrix for the decoding step: one row times the
    (V, C) table is ~2x slower in OpenBLAS than times this copy (minilm: 6.5 -> 3.1 ms a
    token). Made once per weight array (an optimizer update or a reload replaces the array, and
    the copy is made afresh); `eval_mode` drops it after a training loop's mid-run decoding."""
    matrix = model.output_matrix()
    held = model.__dict__.get(_OUTPUT_T)
    if held is None or held[0] is not matrix:
        held = (matrix, mx.contiguous(matrix.T))
        mx.eval(held[1])
        model.__dict__[_OUTPUT_T] = held
    return held[1]


def greedy_or_sample(
    model: Bert2Bert, memory: mx.array, src_mask: mx.array | None, cfg: DecodingConfig, words: WordPieces | None = None,
    src_ids: mx.array | None = None,
) -> Iterator[Step | list[Hypothesis]]:
    """Greedy or sampled decoding for a batch; yields a Step per token, then the hypotheses.
    `src_ids` (B, S), the ids `memory` encodes, are needed by a model with a pointer."""
    c = model.config
    B = memory.shape[0]
    decode = _Stepper(model, memory, src_mask, cfg.max_length, src_ids=src_ids)
    spellings = _spellings(cfg, words, src_ids)
    key = mx.random.key(cfg.seed if cfg.seed is not None else int(np.random.randint(2**31)))
    histories: list[list[int]] = [[] for _ in range(B)]
    reasons: list[str | None] = [None] * B
    tokens = mx.full((B, 1), c.cls_id, dtype=mx.int32)
    for _ in range(cfg.max_length):
        logits = _apply_constraints(decode(tokens), histories, cfg, c.sep_id, c.cls_id, words, spellings)
        if cfg.strategy == "sample":
            key, sub = mx.random.split(key)
            chosen = _sample(mx.array(logits), cfg, sub).tolist()
        else:
            chosen = logits.argmax(axis=-1).tolist()
        for r, tok in enumerate(chosen):
            if reasons[r] is None:
                if tok == c.sep_id:
                    reasons[r] = "eos"
                else:
                    histories[r].append(tok)
        yield Step([list(h) for h in histories], [r is not None for r in reasons])
        if all(r is not None for r in reasons):
            break
        tokens = mx.array(chosen, dtype=mx.int32)[:, None]
    yield [Hypothesis(h, r or "length") for h, r in zip(histories, reasons)]


def beam_search(
    model: Bert2Bert, memory: mx.array, src_mask: mx.array | None, cfg: DecodingConfig, words: WordPieces | None = None,
    src_ids: mx.array | None = None,
) -> Iterator[Step | list[Hypothesis]]:
    """Beam search batched over inputs x beams (rows b*K + k); yields the best running beam per
    input each step, then the best finished hypothesis per input. `src_ids` as for
    `greedy_or_sample`."""
    c = model.config
    B, K = memory.shape[0], cfg.num_beams
    # (B*K, ...) rows; the beams of an input share its cross-attention K/V, projected once.
    decode = _Stepper(model, memory, src_mask, cfg.max_length, beams=K, log_probs=True, src_ids=src_ids,
                      copy_weights=cfg.coverage_penalty > 0)
    covers = decode.copy is not None and cfg.coverage_penalty > 0
    spellings = _spellings(cfg, words, src_ids, K)
    coverage = None  # (B*K, S) copy attention summed over each beam's steps
    penalty = np.zeros(B * K)  # its cost: coverage_penalty * sum over positions of max(coverage - 1, 0)
    reorder = None
    scores = np.full((B, K), -np.inf, dtype=np.float64)
    scores[:, 0] = 0.0  # all beams start identical: only the first may expand at step 1
    histories: list[list[int]] = [[] for _ in range(B * K)]
    finished: list[list[Hypothesis]] = [[] for _ in range(B)]
    done = [False] * B
    tokens = mx.full((B * K, 1), c.cls_id, dtype=mx.int32)
    best: list[list[int]] = [[] for _ in range(B)]
    V = c.vocab_size
    for step in range(cfg.max_length):
        logprobs = _apply_constraints(decode(tokens, reorder), histories, cfg, c.sep_id, c.cls_id, words, spellings)  # (B*K, V)
        if covers:  # `scores` stay the log-probabilities; the penalty is charged on ranking
            coverage = decode.copy.weights.astype(np.float64) + (0.0 if coverage is None else coverage)
            penalty = cfg.coverage_penalty * np.maximum(coverage - 1.0, 0.0).sum(axis=-1)
        # The 2K best candidates per input, picked in NumPy: no MLX kernels or host syncs (a beam
        # step's bookkeeping went from ~2.4 to ~0.6 ms).
        total = (logprobs + (scores.reshape(-1) - penalty)[:, None].astype(np.float32)).reshape(B, K * V)
        top = np.argpartition(-total, 2 * K - 1, axis=-1)[:, : 2 * K]  # (B, 2K) candidates
        top_scores = np.take_along_axis(total, top, axis=-1).astype(np.float64)
        length = step + 1
        rows, next_tokens, next_scores = [], [], []
        for b in range(B):
            order = np.argsort(-top_scores[b], kind="stable")
            kept: list[tuple[int, int, float]] = []
            for rank, j in enumerate(order):
                beam, tok, s = int(top[b, j] // V), int(top[b, j] % V), float(top_scores[b, j])
                if done[b] or not np.isfinite(s):
                    break
                cost = penalty[b * K + beam]
                if tok == c.sep_id:
                    if rank < K:  # HF's rule: an ending is kept only if it ranks among the top K
                        hist = histories[b * K + beam]
                        finished[b].append(Hypothesis(list(hist), "eos", (s + cost) / length**cfg.length_penalty - cost))
                else:
                    kept.append((beam, tok, s + cost))
                if len(kept) == K:
                    break
            while len(kept) < K:  # a finished input (or too few candidates): pad with dead beams
                kept.append((0, c.pad_id, -np.inf))
            finished[b].sort(key=lambda h: -h.score)
            del finished[b][K:]
            if not done[b] and len(finished[b]) >= K:
                best_running = max(s / length**cfg.length_penalty - penalty[b * K + beam] for beam, _, s in kept)
                done[b] = cfg.early_stopping or finished[b][-1].score >= best_running
            for beam, tok, s in kept:
                rows.append(b * K + beam)
                next_tokens.append(tok)
                next_scores.append(s)
        histories = [histories[r] + [t] for r, t in zip(rows, next_tokens)]
        scores = np.array(next_scores, dtype=np.float64).reshape(B, K)
        if covers:
            coverage, penalty = coverage[rows], penalty[rows]
        # The running beam that would win were decoding to stop here (scored as the final pick
        # scores it); a finished input's beams are all dead (-inf): it keeps showing its last best.
        ranked = scores / length**cfg.length_penalty - penalty.reshape(B, K)
        best = [histories[b * K + int(np.argmax(ranked[b]))] if np.isfinite(ranked[b]).any() else best[b] for b in range(B)]
        yield Step(best, list(done))
        if all(done):
            break
        reorder = mx.array(rows, dtype=mx.int32)
        tokens = mx.array(next_tokens, dtype=mx.int32)[:, None]
    results = []
    for b in range(B):
        if not finished[b] or not done[b]:  # ran out of length: running beams count too
            for k in range(K):
                if np.isfinite(scores[b, k]):
                    n = len(histories[b * K + k])
                    score = scores[b, k] / max(n, 1) ** cfg.length_penalty - penalty[b * K + k]
                    finished[b].append(Hypothesis(histories[b * K + k], "length", score))
        results.append(max(finished[b], key=lambda h: h.score))
    yield results


@contextmanager
def eval_mode(model: Bert2Bert) -> Iterator[None]:
    """Dropout off for the duration (a summary must not depend on the training flag); the
    model's previous mode comes back afterwards, so a training loop can decode mid-run."""
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        if was_training:
            model.train()
            model.__dict__.pop(_OUTPUT_T, None)


def check_fits(model: Bert2Bert, src_ids: mx.array, cfg: DecodingConfig) -> None:
    """Raise DecodingError when the source or the summary would run past the model's learned
    position table (MLX would read past its end without complaint and decode garbage)."""
    limit = model.config.max_positions
    if cfg.max_length > limit:
        raise DecodingError(f"max_length {cfg.max_length} is more than this model's {limit} positions; use at most {limit}.")
    if src_ids.ndim != 2:
        raise DecodingError(f"Source ids must be a (batch, length) array, got shape {tuple(src_ids.shape)}.")
    if src_ids.shape[1] > limit:
        raise DecodingError(
            f"The source has {src_ids.shape[1]} tokens but this model reads at most {limit}; truncate it first."
        )


def decode_stream(
    model: Bert2Bert, src_ids: mx.array, src_mask: mx.array | None, cfg: DecodingConfig, words: WordPieces | None = None
) -> Iterator[Step | list[Hypothesis]]:
    """Encode once and decode with the strategy `cfg` asks for: yields Steps, then hypotheses.
    Settings that do not fit the model raise here, before the first step; the model decodes in
    eval mode while the stream runs. `cfg.no_repeat_word` applies only when `words` is given."""
    check_fits(model, src_ids, cfg)
    return _decode(model, src_ids, src_mask, cfg, words)


def _decode(
    model: Bert2Bert, src_ids: mx.array, src_mask: mx.array | None, cfg: DecodingConfig, words: WordPieces | None
) -> Iterator[Step | list[Hypothesis]]:
    with eval_mode(model):
        memory, src_mask, src_ids = _encode(model, src_ids, src_mask)
        search = beam_search if cfg.strategy == "beam" else greedy_or_sample
        yield from search(model, memory, src_mask, cfg, words, src_ids)


def generate(
    model: Bert2Bert, src_ids: mx.array, src_mask: mx.array | None, cfg: DecodingConfig, words: WordPieces | None = None
) -> list[Hypothesis]:
    """Decode a padded batch of sources (B, S) to one hypothesis per row (in eval mode; the
    model's mode is restored afterwards). `cfg.no_repeat_word` applies only when `words`
    (the tokenizer's word pieces) is given."""
    out = None
    for out in decode_stream(model, src_ids, src_mask, cfg, words):
        pass
    return out
