"""Text in, summary out: tokenization, truncation notice, decoding, timing, attention maps."""
from __future__ import annotations

import numbers
import os
import time
from dataclasses import dataclass, field
from typing import Iterator

import mlx.core as mx
import numpy as np

from .decoding import DecodingConfig, WordPieces
from .generate import Hypothesis, Step, decode_stream, eval_mode
from .model import Bert2Bert, Intermediates
from .tokenizer import BatchEncoding, Tokenizer
from .truecase import apply_casing, casing_table


class InputError(ValueError):
    """Input that cannot be summarized: text that is empty or not a string, a bad source length,
    or a tokenizer whose vocabulary does not fit the model."""


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
    # A model with a pointer-generator: its copy attention as one layer of one head (1, 1, T, S),
    # and the share of each step's distribution that copying gave, 1 - gate (T,). None without.
    copy: np.ndarray | None = None
    copy_share: np.ndarray | None = None


@dataclass
class SummaryResult:
    text: str
    token_ids: list[int]
    finish_reason: str  # "eos" or "length"
    truncated: bool  # the input was longer than the source tokens read (model.source_limit, or max_source_length)
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
    """One step of a streamed summary (of the first text, for a batch). Deltas rebuild the text:
    `previous.text[: len(previous.text) - chunk.rewind] + chunk.delta == chunk.text`."""

    text: str  # the summary so far (the best beam so far, for beam search)
    token_ids: list[int]
    result: SummaryResult | list[SummaryResult] | None = None  # set on the last chunk
    token: int | None = None  # the id this step added ([SEP] at the step the model ends it); None: nothing new
    delta: str = ""  # text added since the previous chunk
    finished: bool = False  # the summary is complete: the model ended it, or this is the last chunk
    rewind: int = 0  # characters cut from the end of the previous text first (re-spacing, re-casing, a beam switch)


def _validate(texts: list) -> None:
    for t in texts:
        if not isinstance(t, str):
            raise InputError(f"Text to summarize must be a string, got {type(t).__name__}.")
        if not t.strip():
            raise InputError("The text to summarize is empty.")


def _source_limit(max_source_length: object, model: Bert2Bert) -> int:
    """Source tokens to keep: None means as many as the model was trained to read
    (`model.source_limit`). A larger request is capped at the position table (the model cannot
    read further; the result says it was truncated)."""
    max_positions = model.config.max_positions
    if max_source_length is None:
        return model.source_limit
    if isinstance(max_source_length, bool) or not isinstance(max_source_length, numbers.Integral):
        raise InputError(f"max_source_length must be a whole number of tokens or None, got {max_source_length!r}.")
    if max_source_length < 3:
        raise InputError(f"max_source_length must be at least 3 tokens ([CLS], a word and [SEP]), got {max_source_length}.")
    return min(int(max_source_length), max_positions)


def _check_vocab(model: Bert2Bert, tokenizer: Tokenizer) -> None:
    if tokenizer.vocab_size > model.config.vocab_size:
        raise InputError(
            f"The tokenizer has {tokenizer.vocab_size} tokens but the model's vocabulary has only "
            f"{model.config.vocab_size}: load the tokenizer that was saved with this model."
        )


@dataclass
class _Job:
    """A checked and tokenized request whose decoding has not started yet."""

    texts: list[str]
    single: bool  # one str in, one SummaryResult out
    src_ids: mx.array  # (B, S)
    batch: BatchEncoding
    counts: list[int]  # source tokens before truncation
    tables: list[dict[str, str]] | None  # per-text casing for an uncased tokenizer, built once
    steps: Iterator[Step | list[Hypothesis]]  # the decoding stream, not started
    prep_seconds: float  # checking and tokenizing count in the result's seconds


def _start(
    model: Bert2Bert, tokenizer: Tokenizer, text: object, max_source_length: object, decoding: dict
) -> _Job:
    """Check everything and tokenize, so every input error is raised before decoding starts."""
    start = time.perf_counter()
    cfg = DecodingConfig.from_kwargs(**decoding)
    single = isinstance(text, str)
    if not single and not isinstance(text, (list, tuple)):
        raise InputError(f"Text to summarize must be a string or a list of strings, got {type(text).__name__}.")
    texts = [text] if single else list(text)
    if not texts:
        raise InputError("No texts to summarize.")
    _validate(texts)
    _check_vocab(model, tokenizer)
    limit = _source_limit(max_source_length, model)
    batch = tokenizer.batch_encode(texts, max_length=limit)
    counts = batch.num_tokens  # one tokenization per text
    src_ids = mx.array(batch.ids)
    words = WordPieces.of(tokenizer)
    steps = decode_stream(model, src_ids, mx.array(batch.attention_mask), cfg, words)  # checks cfg against the model
    # Uncased models lose names' capitals; the sources give them back.
    tables = [casing_table(t) for t in texts] if tokenizer.lowercase else None
    return _Job(texts, single, src_ids, batch, counts, tables, steps, time.perf_counter() - start)


def _text(tokenizer: Tokenizer, ids: list[int], table: dict[str, str] | None) -> str:
    text = tokenizer.decode(ids)
    return apply_casing(text, table) if table is not None else text


def _results(
    model: Bert2Bert, tokenizer: Tokenizer, job: _Job, hyps: list[Hypothesis], seconds: float, return_attention: bool
) -> list[SummaryResult]:
    results = [
        SummaryResult(
            _text(tokenizer, h.tokens, job.tables[i] if job.tables else None),
            h.tokens, h.finish_reason, job.batch.truncated[i], job.counts[i], seconds,
        )
        for i, h in enumerate(hyps)
    ]
    if return_attention:
        for i, r in enumerate(results):
            n = int(job.batch.lengths[i])
            src = job.src_ids[i : i + 1, :n]  # (1, S_i): this input without padding
            r.attentions = attention_maps(model, tokenizer, src, r.token_ids, r.finish_reason == "eos")
    return results


def summarize(
    model: Bert2Bert,
    tokenizer: Tokenizer,
    text: str | list[str],
    return_attention: bool = False,
    max_source_length: int | None = None,
    **decoding,
) -> SummaryResult | list[SummaryResult]:
    """Summarize one text (-> SummaryResult) or a list (-> list, decoded together as a batch).
    `decoding` takes DecodingConfig's fields (num_beams, max_length, do_sample, ...);
    `max_source_length` (None: the length the model was trained on, `model.source_limit`) truncates the source."""
    job = _start(model, tokenizer, text, max_source_length, decoding)
    start = time.perf_counter() - job.prep_seconds
    hyps: list[Hypothesis] = []
    for out in job.steps:  # only the final hypotheses are turned into text
        if not isinstance(out, Step):
            hyps = out
    results = _results(model, tokenizer, job, hyps, time.perf_counter() - start, return_attention)
    return results[0] if job.single else results


def stream_summarize(
    model: Bert2Bert,
    tokenizer: Tokenizer,
    text: str | list[str],
    return_attention: bool = False,
    max_source_length: int | None = None,
    **decoding,
) -> Iterator[StreamChunk]:
    """Yield the summary as it grows (one chunk per generated token); the last chunk's
    `.result` holds the SummaryResult (a list of them for a list of texts). Bad input raises
    here, at the call, not when the stream is first read."""
    job = _start(model, tokenizer, text, max_source_length, decoding)
    return _stream(model, tokenizer, job, return_attention)


def _chunk(previous: str, text: str, ids: list[int], **fields) -> StreamChunk:
    keep = len(os.path.commonprefix([previous, text]))
    return StreamChunk(text, ids, delta=text[keep:], rewind=len(previous) - keep, **fields)


def _stream(model: Bert2Bert, tokenizer: Tokenizer, job: _Job, return_attention: bool) -> Iterator[StreamChunk]:
    start = time.perf_counter() - job.prep_seconds
    table = job.tables[0] if job.tables else None
    text, ids, finished = "", [], False
    hyps: list[Hypothesis] = []
    for out in job.steps:
        if not isinstance(out, Step):
            hyps = out
            continue
        new_ids, ended = out.tokens[0], out.finished[0] and not finished
        token = new_ids[-1] if len(new_ids) > len(ids) else (model.config.sep_id if ended else None)
        new_text = _text(tokenizer, new_ids, table) if new_ids != ids else text  # a finished input stays put
        yield _chunk(text, new_text, list(new_ids), token=token, finished=out.finished[0])
        text, ids, finished = new_text, new_ids, out.finished[0]
    results = _results(model, tokenizer, job, hyps, time.perf_counter() - start, return_attention)
    first = results[0]
    yield _chunk(text, first.text, first.token_ids, result=first if job.single else results, finished=True)


def attention_maps(
    model: Bert2Bert, tokenizer: Tokenizer, src_ids: mx.array | list[int], summary_ids: list[int], ended: bool = True
) -> AttentionMaps:
    """Re-run the finished summary teacher-forced (one pass, explicit attention) to collect
    every layer's and head's weights: the same numbers the cached decode computed. `src_ids`:
    (1, S) ids, or one list of ids (callers need not import mlx)."""
    c = model.config
    if not isinstance(src_ids, mx.array):
        src_ids = mx.array(np.asarray(src_ids, dtype=np.int32).reshape(1, -1))
    produced = list(summary_ids) + ([c.sep_id] if ended else [])
    if src_ids.shape[-1] > c.max_positions or len(produced) > c.max_positions:
        raise InputError(f"Attention maps cover at most {c.max_positions} source and {c.max_positions} summary tokens.")
    tgt = mx.array([[c.cls_id] + produced[:-1]], dtype=mx.int32)  # (1, T): the inputs of each step
    inter = Intermediates()
    with eval_mode(model):  # dropout would change the maps
        memory = model.encode(src_ids, None, inter)
        h = model.decode(tgt, memory, None, intermediates=inter)
        copy = share = None
        if "pointer" in model:
            weights, gate = model.point(h, memory, src_ids)  # (1, T, S), (1, T)
            copy = np.array(weights[None].astype(mx.float16))  # (1, 1, T, S)
            share = np.array(mx.sigmoid(-gate[0]))

    def stack(maps: list[mx.array]) -> np.ndarray:
        return np.array(mx.stack([m[0] for m in maps]).astype(mx.float16)) if maps else np.zeros((0,), np.float16)

    return AttentionMaps(
        source_tokens=tokenizer.convert_ids_to_tokens(np.array(src_ids[0]).tolist()),
        summary_tokens=tokenizer.convert_ids_to_tokens(produced),
        encoder=stack(inter.encoder),
        decoder=stack(inter.decoder),
        cross=stack(inter.cross),
        copy=copy,
        copy_share=share,
    )
