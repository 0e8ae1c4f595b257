"""Decoding: greedy, sampling and beam search over a KV cache, batched over inputs and beams.

The encoder runs once per input; cross-attention keys/values are projected once into the cache
(beam rows are copies of their input's rows); each step feeds only the newest token."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import mlx.core as mx
import numpy as np

from .model import Bert2Bert


class DecodingError(ValueError):
    """Invalid decoding settings."""


@dataclass(frozen=True)
class DecodingConfig:
    max_length: int = 128  # new tokens; CNN/DM highlights are ~60 WordPieces
    min_length: int = 0  # [SEP] is banned before this many tokens
    num_beams: int = 1
    length_penalty: float = 1.0  # beam scores are divided by length ** length_penalty
    no_repeat_ngram_size: int = 3  # summaries that repeat a trigram read badly; 0 turns it off
    early_stopping: bool = True  # beam: stop once num_beams hypotheses have finished
    do_sample: bool = False
    temperature: float = 1.0
    top_k: int = 0  # 0: no top-k filter
    top_p: float = 1.0  # nucleus sampling; 1.0: no filter
    seed: int | None = None

    def __post_init__(self) -> None:
        checks = [
            (isinstance(self.max_length, int) and self.max_length >= 1, f"max_length must be an integer >= 1, got {self.max_length!r}."),
            (isinstance(self.min_length, int) and self.min_length >= 0, f"min_length must be an integer >= 0, got {self.min_length!r}."),
            (self.max_length >= self.min_length, f"max_length ({self.max_length}) must be at least min_length ({self.min_length})."),
            (isinstance(self.num_beams, int) and self.num_beams >= 1, f"num_beams must be an integer >= 1, got {self.num_beams!r}."),
            (isinstance(self.no_repeat_ngram_size, int) and self.no_repeat_ngram_size >= 0, "no_repeat_ngram_size must be an integer >= 0."),
            (self.temperature >= 0, f"temperature must not be negative, got {self.temperature}."),
            (0 < self.top_p <= 1, f"top_p must be in (0, 1], got {self.top_p}."),
            (isinstance(self.top_k, int) and self.top_k >= 0, f"top_k must be an integer >= 0, got {self.top_k!r}."),
            (not (self.do_sample and self.num_beams > 1), "Sampling with num_beams > 1 is not supported: choose one."),
        ]
        for ok, message in checks:
            if not ok:
                raise DecodingError(message)

    @property
    def strategy(self) -> str:
        if self.num_beams > 1:
            return "beam"
        return "sample" if self.do_sample and self.temperature > 0 else "greedy"


@dataclass
class Hypothesis:
    tokens: list[int]  # generated ids, without the start token and without the final [SEP]
    finish_reason: str  # "eos" (the model ended it) or "length" (max_length reached)
    score: float = 0.0  # beam search: length-normalised log-probability


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


def _apply_constraints(logits: mx.array, histories: list[list[int]], cfg: DecodingConfig, eos_id: int) -> mx.array:
    """Ban [SEP] before min_length and tokens that repeat an n-gram, as -inf logits."""
    rows, cols = [], []
    for r, hist in enumerate(histories):
        banned = _banned_ngrams(hist, cfg.no_repeat_ngram_size)
        if len(hist) < cfg.min_length:
            banned.append(eos_id)
        rows += [r] * len(banned)
        cols += banned
    if not rows:
        return logits
    penalty = np.zeros(logits.shape, dtype=np.float32)
    penalty[rows, cols] = -np.inf
    return logits + mx.array(penalty)


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


def greedy_or_sample(
    model: Bert2Bert, memory: mx.array, src_mask: mx.array | None, cfg: DecodingConfig
) -> Iterator[Step | list[Hypothesis]]:
    """Greedy or sampled decoding for a batch; yields a Step per token, then the hypotheses."""
    c = model.config
    B = memory.shape[0]
    cache = model.make_cache(memory, src_mask)
    key = mx.random.key(cfg.seed if cfg.seed is not None else int(np.random.randint(2**31)))
    histories: list[list[int]] = [[] for _ in range(B)]
    reasons: list[str | None] = [None] * B
    tokens = mx.full((B, 1), c.cls_id, dtype=mx.int32)
    for _ in range(cfg.max_length):
        logits = _apply_constraints(model.decode_step(tokens, cache), histories, cfg, c.sep_id)
        if cfg.strategy == "sample":
            key, sub = mx.random.split(key)
            nxt = _sample(logits, cfg, sub)
        else:
            nxt = mx.argmax(logits, axis=-1)
        chosen = nxt.tolist()  # the one host sync per step: [SEP] decides when to stop
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
    model: Bert2Bert, memory: mx.array, src_mask: mx.array | None, cfg: DecodingConfig
) -> Iterator[Step | list[Hypothesis]]:
    """Beam search batched over inputs x beams (rows b*K + k); yields the best running beam per
    input each step, then the best finished hypothesis per input."""
    c = model.config
    B, K = memory.shape[0], cfg.num_beams
    cache = model.make_cache(memory, src_mask)
    cache.reorder(mx.repeat(mx.arange(B), K), cross=True)  # (B*K, ...) rows, projected once
    scores = np.full((B, K), -np.inf, dtype=np.float64)
    scores[:, 0] = 0.0  # all beams start identical: only the first may expand at step 1
    histories: list[list[int]] = [[] for _ in range(B * K)]
    finished: list[list[Hypothesis]] = [[] for _ in range(B)]
    done = [False] * B
    tokens = mx.full((B * K, 1), c.cls_id, dtype=mx.int32)
    V = c.vocab_size
    for step in range(cfg.max_length):
        logits = model.decode_step(tokens, cache).astype(mx.float32)
        logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)  # (B*K, V)
        logprobs = _apply_constraints(logprobs, histories, cfg, c.sep_id)
        total = (logprobs + mx.array(scores.reshape(-1, 1), dtype=mx.float32)).reshape(B, K * V)
        top = mx.argpartition(-total, 2 * K - 1, axis=-1)[:, : 2 * K]  # (B, 2K) candidates
        top_scores = np.array(mx.take_along_axis(total, top, axis=-1), dtype=np.float64)
        top = np.array(top)
        length = step + 1
        rows, next_tokens, next_scores = [], [], []
        for b in range(B):
            order = np.argsort(-top_scores[b])
            kept: list[tuple[int, int, float]] = []
            for rank, j in enumerate(order):
                beam, tok, s = int(top[b, j] // V), int(top[b, j] % V), float(top_scores[b, j])
                if done[b] or not np.isfinite(s):
                    break
                if tok == c.sep_id:
                    if rank < K:  # HF's rule: an ending is kept only if it ranks among the top K
                        hist = histories[b * K + beam]
                        finished[b].append(Hypothesis(list(hist), "eos", s / length**cfg.length_penalty))
                else:
                    kept.append((beam, tok, s))
                if len(kept) == K:
                    break
            while len(kept) < K:  # a finished input (or too few candidates): pad with dead beams
                kept.append((0, c.pad_id, -np.inf))
            finished[b].sort(key=lambda h: -h.score)
            del finished[b][K:]
            if not done[b] and len(finished[b]) >= K:
                best_running = max(s for _, _, s in kept) / length**cfg.length_penalty
                done[b] = cfg.early_stopping or finished[b][-1].score >= best_running
            for beam, tok, s in kept:
                rows.append(b * K + beam)
                next_tokens.append(tok)
                next_scores.append(s)
        histories = [histories[r] + [t] for r, t in zip(rows, next_tokens)]
        scores = np.array(next_scores, dtype=np.float64).reshape(B, K)
        best = [histories[b * K + int(np.argmax(scores[b]))] if np.isfinite(scores[b]).any() else [] for b in range(B)]
        yield Step(best, list(done))
        if all(done):
            break
        cache.reorder(mx.array(rows, dtype=mx.int32))
        tokens = mx.array(next_tokens, dtype=mx.int32)[:, None]
    results = []
    for b in range(B):
        if not finished[b] or not done[b]:  # ran out of length: running beams count too
            for k in range(K):
                if np.isfinite(scores[b, k]):
                    n = len(histories[b * K + k])
                    finished[b].append(Hypothesis(histories[b * K + k], "length", scores[b, k] / max(n, 1) ** cfg.length_penalty))
        results.append(max(finished[b], key=lambda h: h.score))
    yield results


def decode_stream(
    model: Bert2Bert, src_ids: mx.array, src_mask: mx.array | None, cfg: DecodingConfig
) -> Iterator[Step | list[Hypothesis]]:
    """Encode once and decode with the strategy `cfg` asks for: yields Steps, then hypotheses."""
    memory = model.encode(src_ids, src_mask)
    search = beam_search if cfg.strategy == "beam" else greedy_or_sample
    yield from search(model, memory, src_mask, cfg)


def generate(model: Bert2Bert, src_ids: mx.array, src_mask: mx.array | None, cfg: DecodingConfig) -> list[Hypothesis]:
    """Decode a padded batch of sources (B, S) to one hypothesis per row."""
    out = None
    for out in decode_stream(model, src_ids, src_mask, cfg):
        pass
    return out
