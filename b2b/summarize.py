"""Text in, summary out: tokenization, truncation notice, decoding, timing, attention maps."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Iterator

import mlx.core as mx
import numpy as np

from .generate import DecodingConfig, Hypothesis, Step, decode_stream
from .model import Bert2Bert, Intermediates
from .tokenizer import Tokenizer
from .truecase import truecase


class InputError(ValueError):
    """Text that cannot be summarized (empty, not a string)."""


@dataclass
class AttentionMaps:
    """Attention weights for one input and its summary, float16 numpy, per layer and head.
    Decoder rows: row i is the step that produced `summary_tokens[i]` (its query is the token
    before it, [CLS] for the first)."""

    source_tokens: list[str]
    summary_tokens: list[str]
    encoder: np.ndarray  # (L, H, S, S)
    decoder: np.ndarray  # (L, H, T, T)
    cross: np.ndarray  # (L, H, T, S)


@dataclass
class SummaryResult:
    text: str
    token_ids: list[int]
    finish_reason: str  # "eos" or "length"
    truncated: bool  # the input was longer than the model's max positions
    num_input_tokens: int  # before truncation, with [CLS]/[SEP]
    seconds: float = 0.0
    attentions: AttentionMaps | None = field(default=None, repr=False)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def tokens_per_sec(self) -> float:
        return self.num_tokens / self.seconds if self.seconds > 0 else 0.0


@dataclass
class StreamChunk:
    text: str  # the summary so far (the best beam so far, for beam search)
    token_ids: list[int]
    result: SummaryResult | None = None  # set on the last chunk


def _validate(texts: list) -> None:
    for t in texts:
        if not isinstance(t, str):
            raise InputError(f"Text to summarize must be a string, got {type(t).__name__}.")
        if not t.strip():
            raise InputError("The text to summarize is empty.")


def _prepare(model: Bert2Bert, tokenizer: Tokenizer, texts: list[str], max_source_length: int | None):
    _validate(texts)
    limit = min(max_source_length or model.config.max_positions, model.config.max_positions)
    batch = tokenizer.batch_encode(texts, max_length=limit)
    counts = [tokenizer.encode(t, max_length=limit).num_tokens for t in texts]
    return mx.array(batch.ids), mx.array(batch.attention_mask), batch, counts


def summarize(
    model: Bert2Bert,
    tokenizer: Tokenizer,
    text: str | list[str],
    return_attention: bool = False,
    max_source_length: int | None = None,
    **decoding,
) -> SummaryResult | list[SummaryResult]:
    """Summarize one text (-> SummaryResult) or a list (-> list, decoded together as a batch).
    `decoding` takes DecodingConfig's fields (num_beams, max_length, do_sample, ...)."""
    result = None
    for chunk in stream_summarize(model, tokenizer, text, return_attention, max_source_length, **decoding):
        result = chunk.result
    return result


def stream_summarize(
    model: Bert2Bert,
    tokenizer: Tokenizer,
    text: str | list[str],
    return_attention: bool = False,
    max_source_length: int | None = None,
    **decoding,
) -> Iterator[StreamChunk]:
    """Yield the summary as it grows (one chunk per generated token); the last chunk's
    `.result` holds the SummaryResult (a list of them for a list of texts)."""
    cfg = DecodingConfig(**decoding)
    single = isinstance(text, str)
    if not single and not isinstance(text, (list, tuple)):
        raise InputError(f"Text to summarize must be a string or a list of strings, got {type(text).__name__}.")
    texts = [text] if single else list(text)
    if not texts:
        raise InputError("No texts to summarize.")
    start = time.perf_counter()
    src_ids, src_mask, batch, counts = _prepare(model, tokenizer, texts, max_source_length)

    def text_of(tokens: list[int], i: int) -> str:
        text = tokenizer.decode(tokens)
        return truecase(text, texts[i]) if tokenizer.lowercase else text  # uncased models lose names' capitals

    hyps: list[Hypothesis] = []
    for out in decode_stream(model, src_ids, src_mask, cfg):
        if isinstance(out, Step):
            yield StreamChunk(text_of(out.tokens[0], 0), out.tokens[0])
        else:
            hyps = out
    seconds = time.perf_counter() - start
    results = [
        SummaryResult(text_of(h.tokens, i), h.tokens, h.finish_reason, batch.truncated[i], counts[i], seconds)
        for i, h in enumerate(hyps)
    ]
    if return_attention:
        for i, r in enumerate(results):
            n = int(batch.lengths[i])
            r.attentions = attention_maps(model, tokenizer, src_ids[i : i + 1, :n], r.token_ids, r.finish_reason == "eos")
    final = results[0] if single else results
    yield StreamChunk(results[0].text, results[0].token_ids, final)


def attention_maps(
    model: Bert2Bert, tokenizer: Tokenizer, src_ids: mx.array, summary_ids: list[int], ended: bool = True
) -> AttentionMaps:
    """Re-run the finished summary teacher-forced (one pass, explicit attention) to collect
    every layer's and head's weights: the same numbers the cached decode computed."""
    c = model.config
    produced = list(summary_ids) + ([c.sep_id] if ended else [])
    tgt = mx.array([[c.cls_id] + produced[:-1]], dtype=mx.int32)  # (1, T): the inputs of each step
    inter = Intermediates()
    memory = model.encode(src_ids, None, inter)
    model.decode(tgt, memory, None, intermediates=inter)

    def stack(maps: list[mx.array]) -> np.ndarray:
        return np.array(mx.stack([m[0] for m in maps]).astype(mx.float16)) if maps else np.zeros((0,), np.float16)

    return AttentionMaps(
        source_tokens=tokenizer.convert_ids_to_tokens(np.array(src_ids[0]).tolist()),
        summary_tokens=tokenizer.convert_ids_to_tokens(produced),
        encoder=stack(inter.encoder),
        decoder=stack(inter.decoder),
        cross=stack(inter.cross),
    )
