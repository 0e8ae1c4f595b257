"""Data loading for summarization fine-tuning, and the file/split/hub helpers every loader shares
(pre-training text: train.text_data; batching: train.batching).

numpy only: arrays leave here as int32 numpy and become `mx.array` in the training loop, so
this module is testable without MLX. Local files are the main path; a name that is not a path
goes to `datasets.load_dataset` for users with the network.
"""
from __future__ import annotations

import csv
import gzip
import json
import logging
import os
import re
from dataclasses import dataclass, field
from typing import Iterator, Protocol, Sequence

import numpy as np
from tqdm import tqdm

log = logging.getLogger(__name__)

TEXT_SUFFIXES = (".tokens", ".txt", ".raw")  # preference order when one stem has several
PAIR_SUFFIXES = (".jsonl.gz", ".jsonl", ".json", ".csv", ".parquet")
# Split names as the official files spell them; `val` is what the shared CNN/DM folder uses.
SPLIT_ALIASES = {
    "train": ("train",),
    "validation": ("validation", "valid", "val", "dev"),
    "test": ("test",),
}


class DataError(ValueError):
    """Unusable training data; the message is one sentence naming the file (and line)."""


class DataFileNotFound(DataError, FileNotFoundError):
    """A data path that does not exist (catchable as either parent)."""


class TokenizerLike(Protocol):
    """The slice of `b2b.tokenizer.Tokenizer` this module needs."""

    pad_id: int
    cls_id: int
    sep_id: int

    def encode_plain(self, texts: list[str]) -> list[list[int]]: ...


# --------------------------------------------------------------------------- sources


def canonical_split(split: str) -> str:
    """Map `val`/`valid`/`dev` to `validation` (the hub's name); other names pass through."""
    for name, aliases in SPLIT_ALIASES.items():
        if split in aliases:
            return name
    return split


def looks_like_path(source: str) -> bool:
    """Hub names are `name` or `owner/name`; anything else that does not exist is a typo'd path."""
    if source.endswith(TEXT_SUFFIXES + PAIR_SUFFIXES):
        return True
    return source.startswith(("/", ".", "~")) or source.count("/") > 1 or (os.sep != "/" and os.sep in source)


def _split_of(filename: str) -> str | None:
    """The split a file name mentions (`wiki.valid.tokens` -> validation), or None."""
    words = re.split(r"[._\-]", os.path.basename(filename).lower())
    for name, aliases in SPLIT_ALIASES.items():
        if any(a in words for a in aliases):
            return name
    return None


def files_for_split(folder: str, suffixes: Sequence[str], split: str) -> list[str]:
    """Files under `folder` (recursively, sorted) with a known suffix; if their names mention
    splits, only those of `split`, so a WikiText folder does not mix train with test."""
    found = sorted(
        os.path.join(root, name)
        for root, _, names in os.walk(folder)
        for name in names
        if name.endswith(tuple(suffixes))
    )
    if any(_split_of(f) for f in found):
        found = [f for f in found if _split_of(f) == canonical_split(split)]
    # `wiki.valid.tokens` and `wiki.valid.raw` are the same text: keep the preferred suffix.
    chosen: dict[str, tuple[int, str]] = {}
    for f in found:
        rank, suffix = next((k, s) for k, s in enumerate(suffixes) if f.endswith(s))
        stem = f[: -len(suffix)]
        chosen[stem] = min(chosen.get(stem, (rank, f)), (rank, f))
    return sorted(f for _, f in chosen.values())


def folder_has_split(source: str, split: str, pairs: bool) -> bool:
    """Whether `source` is a folder with its own files for `split`: `val.jsonl.gz` beside
    `train.jsonl.gz` (`pairs`), or `wiki.valid.tokens` beside `wiki.train.tokens` (text)."""
    if not os.path.isdir(source):
        return False
    if pairs:
        try:
            return _resolve_pair_file(source, split) is not None
        except DataFileNotFound:
            return False
    want = canonical_split(split)
    return any(_split_of(f) == want for f in files_for_split(source, TEXT_SUFFIXES, split))


def load_hub(source: str, config: str | None, split: str, limit: int | None):
    """`datasets.load_dataset(source, config, split=split)`, its failure turned into DataError."""
    import datasets  # heavy; only online users pay for it

    split = canonical_split(split)
    try:
        ds = datasets.load_dataset(source, config, split=split)
    except (FileNotFoundError, ConnectionError, ValueError, OSError) as err:
        raise DataError(
            f"Could not load {source!r} (config {config!r}, split {split!r}) from the Hugging Face "
            f"hub, and no local file of that name exists: {err}"
        ) from err
    if limit is not None:
        ds = ds.select(range(min(limit, len(ds))))
    return ds


# --------------------------------------------------------------------------- summarization


@dataclass
class SummarizationData:
    """Article/summary pairs; multi-sentence summaries are joined with "\\n"."""

    articles: list[str]
    summaries: list[str]
    skipped_empty: int = 0
    source: str = ""

    def __len__(self) -> int:
        return len(self.articles)


def _as_text(value: object) -> str:
    """A field value as text: a list of sentences is joined with newlines (the PTB layout)."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value.strip()
    if isinstance(value, (list, tuple, np.ndarray)):
        return "\n".join(s for s in (str(v).strip() for v in value) if s)
    return str(value).strip()


def _missing_field(where: str, missing: str, have: Sequence[str]) -> DataError:
    return DataError(f"{where} has no field {missing!r}; its fields are: {', '.join(map(str, have)) or 'none'}.")


def _json_rows(path: str) -> Iterator[tuple[int, dict]]:
    """(line number, object) per JSON line of a .jsonl/.jsonl.gz/.json file; a .json file that
    holds one array is accepted too."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8-sig") as f:
        first = True
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            if first and line.lstrip().startswith("["):
                try:
                    rows = json.loads(line + f.read())
                except json.JSONDecodeError as err:
                    raise DataError(f"{path} is not valid JSON (line {err.lineno}): {err.msg}.") from err
                yield from enumerate(rows, 1)
                return
            first = False
            try:
                yield number, json.loads(line)
            except json.JSONDecodeError as err:
                raise DataError(f"{path} line {number} is not valid JSON: {err.msg} (column {err.colno}).") from err


def _csv_rows(path: str) -> Iterator[tuple[int, dict]]:
    csv.field_size_limit(1 << 30)  # articles are far longer than csv's 128 KB default limit
    with open(path, newline="", encoding="utf-8-sig") as f:
        reader = csv.DictReader(f)
        for row in reader:
            yield reader.line_num, row


def _parquet_columns(path: str, fields: Sequence[str]) -> tuple[list, list]:
    import pyarrow.parquet as pq

    parquet = pq.ParquetFile(path)
    names = parquet.schema_arrow.names
    for name in fields:
        if name not in names:
            raise _missing_field(path, name, names)
    table = parquet.read(columns=list(fields))
    return table.column(fields[0]).to_pylist(), table.column(fields[1]).to_pylist()


def _resolve_pair_file(source: str, split: str) -> str | None:
    """The file to read for `source` (a file, or a folder holding `train.jsonl.gz`,
    `val.jsonl.gz`, ...), None for a hub name."""
    if os.path.isfile(source):
        return source
    if os.path.isdir(source):
        aliases = SPLIT_ALIASES.get(canonical_split(split), (split,))
        for name in aliases:
            for suffix in PAIR_SUFFIXES:
                path = os.path.join(source, name + suffix)
                if os.path.isfile(path):
                    return path
        raise DataFileNotFound(f"The folder {source} has no {split} file (looked for {aliases[0]}.jsonl.gz and similar).")
    if looks_like_path(source):
        raise DataFileNotFound(f"The data file {source} does not exist.")
    return None


def load_summarization_pairs(
    source: str,
    article_field: str = "article",
    summary_field: str = "highlights",
    split: str = "train",
    config: str | None = None,
    limit: int | None = None,
) -> SummarizationData:
    """Article/summary pairs from .jsonl(.gz)/.json/.csv/.parquet, a folder of split files, or
    a hub dataset (e.g. `cnn_dailymail`, config `3.0.0`). Pairs with an empty article or
    summary are skipped and counted; at most `limit` usable pairs are kept."""
    path = _resolve_pair_file(source, split)
    fields = (article_field, summary_field)
    if path is None:
        ds = load_hub(source, config, split, limit)
        for name in fields:
            if name not in ds.column_names:
                raise _missing_field(f"The dataset {source!r}", name, ds.column_names)
        pairs: Iterator[tuple[object, object]] = zip(ds[article_field], ds[summary_field])
    elif path.endswith(TEXT_SUFFIXES):
        raise DataError(
            f"{path} is plain text ({'/'.join(TEXT_SUFFIXES)}), not article/summary pairs: give a .jsonl, .jsonl.gz, "
            ".json, .csv or .parquet file (plain text is for MLM pretraining, train.pretrain)."
        )
    elif path.endswith(".parquet"):
        pairs = zip(*_parquet_columns(path, fields))
    else:
        rows = _csv_rows(path) if path.endswith(".csv") else _json_rows(path)
        pairs = _checked_pairs(rows, path, fields)
    data = SummarizationData([], [], 0, source if path is None else path)
    for article, summary in pairs:
        article, summary = _as_text(article), _as_text(summary)
        if not article or not summary:
            data.skipped_empty += 1
            continue
        data.articles.append(article)
        data.summaries.append(summary)
        if limit is not None and len(data.articles) >= limit:
            break
    if not data.articles:
        raise DataError(f"{data.source} has no usable pairs ({data.skipped_empty} had an empty article or summary).")
    if data.skipped_empty:
        log.info("Skipped %d pairs with an empty article or summary in %s.", data.skipped_empty, data.source)
    return data


# CNN marked the highlights of updated stories with a "NEW:" label. 8% of the training pairs in
# CNN/DailyMail's train split (as in ../shared) carry one, and none of its test set: a model
# trained on them starts a third of its test summaries with "New:", which no reference has.
_UPDATE_LABEL = re.compile(r"^[ \t]*new[ \t]*:[ \t]*", re.IGNORECASE | re.MULTILINE)


def strip_update_labels(data: SummarizationData) -> int:
    """Remove CNN's "NEW:" label from the start of every summary line, in place; returns the
    number of summaries changed. A summary that is nothing but labels is left as it was."""
    def strip(summary: str) -> str:
        stripped = _UPDATE_LABEL.sub("", summary)
        return stripped if stripped.strip() else summary

    return _rewrite_summaries(data, strip)


def _rewrite_summaries(data: SummarizationData, rewrite) -> int:
    """Replace each summary with `rewrite(summary)`, in place; returns how many changed."""
    changed = 0
    for i, summary in enumerate(data.summaries):
        new = rewrite(summary)
        if new != summary:
            data.summaries[i] = new
            changed += 1
    return changed


# 5% of CNN/DailyMail's training highlight lines (in 15% of its pairs) end without a full stop,
# most on a closing quote (`the filmmaker also did " grey gardens "`). Summaries are joined into
# one token sequence, so the next sentence then follows with no mark between them, and a model
# trained on it writes run-on sentences (`he was "over it" kaminsky was ...`) that neither readers
# nor ROUGE-Lsum can split.
_ENDED = re.compile(r"[.!?][\s\"'’”)\]]*$")


def end_sentences(data: SummarizationData) -> int:
    """End every summary line that has no . ! ? (before closing quotes or brackets) with a full
    stop, in place; returns the number of summaries changed."""
    def end(summary: str) -> str:
        lines = summary.split("\n")
        return "\n".join(line if not line.strip() or _ENDED.search(line) else line.rstrip() + " ." for line in lines)

    return _rewrite_summaries(data, end)


def _checked_pairs(
    rows: Iterator[tuple[int, dict]], path: str, fields: tuple[str, str]
) -> Iterator[tuple[object, object]]:
    a, s = fields
    for number, row in rows:
        if not isinstance(row, dict):
            raise DataError(f"{path} line {number} is a JSON {type(row).__name__}, not an object.")
        try:
            yield row[a], row[s]
        except KeyError as err:
            raise _missing_field(f"{path} line {number}", err.args[0], list(row)) from None


@dataclass
class TokenizedPairs:
    """Token ids per pair: `[CLS] article [SEP]` and `[CLS] summary [SEP]` (decoder input is
    target[:-1], labels target[1:]; the caller shifts)."""

    sources: list[np.ndarray]
    targets: list[np.ndarray]
    num_truncated_sources: int = 0
    num_truncated_targets: int = 0
    source_lengths: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))

    def __len__(self) -> int:
        return len(self.sources)


def encode_prefixes(
    texts: list[str], tokenizer: TokenizerLike, max_tokens: int, chars_per_token: float = 5.5
) -> tuple[list[list[int]], np.ndarray]:
    """The first `max_tokens` token ids of each text and whether more followed. Exact, but
    ~1.5x faster on news articles than encoding them whole: each text is cut at a space after
    about `max_tokens * chars_per_token` characters (WordPiece never joins across a space, so
    the kept tokens are the same); a text whose cut yields too few tokens is cut again 1.5x
    longer. Returns (ids, truncated (N,) bool)."""
    ids: list[list[int]] = [[] for _ in texts]
    truncated = np.zeros(len(texts), dtype=bool)
    pending = list(range(len(texts)))
    limit = int((max_tokens + 1) * chars_per_token)
    while pending:
        cut = []
        for k in pending:
            end = texts[k].find(" ", limit) if len(texts[k]) > limit else -1
            cut.append(texts[k] if end < 0 else texts[k][:end])
        retry = []
        for k, piece, x in zip(pending, cut, tokenizer.encode_plain(cut)):
            if len(x) > max_tokens:
                ids[k], truncated[k] = x[:max_tokens], True
            elif len(piece) == len(texts[k]):
                ids[k] = x
            else:  # the cut came too early for this text: more characters per token
                retry.append(k)
        pending, limit = retry, int(limit * 1.5)
    return ids, truncated


def tokenize_pairs(
    data: SummarizationData, tokenizer: TokenizerLike, max_source_len: int, max_target_len: int
) -> TokenizedPairs:
    """Tokenize every pair to `[CLS] ... [SEP]`, sources truncated to `max_source_len` and
    targets to `max_target_len` tokens (the final [SEP] is kept so the decoder learns to stop)."""
    if max_source_len < 3 or max_target_len < 3:
        raise ValueError(f"max_source_len and max_target_len must be at least 3, got {max_source_len}, {max_target_len}.")
    cls, sep = tokenizer.cls_id, tokenizer.sep_id

    def wrap(body: list[int]) -> np.ndarray:
        out = np.empty(len(body) + 2, dtype=np.int32)
        out[0], out[1:-1], out[-1] = cls, body, sep
        return out

    sources: list[np.ndarray] = []
    targets: list[np.ndarray] = []
    src_cut, tgt_cut = 0, 0
    # Chunks bound the memory of the tokenizer's Encoding objects and drive the progress bar.
    chunk = 4096
    bar = tqdm(total=len(data), desc="tokenizing", unit=" pairs", disable=len(data) <= chunk)
    for start in range(0, len(data), chunk):
        ids, cut = encode_prefixes(data.articles[start : start + chunk], tokenizer, max_source_len - 2)
        sources += [wrap(x) for x in ids]
        src_cut += int(cut.sum())
        ids, cut = encode_prefixes(data.summaries[start : start + chunk], tokenizer, max_target_len - 2)
        targets += [wrap(x) for x in ids]
        tgt_cut += int(cut.sum())
        bar.update(len(ids))
    bar.close()
    result = TokenizedPairs(
        sources, targets, src_cut, tgt_cut,
        np.fromiter((len(s) for s in sources), dtype=np.int32, count=len(sources)),
    )
    log.info(
        "Tokenized %d pairs: %d articles truncated to %d tokens, %d summaries to %d.",
        len(result), result.num_truncated_sources, max_source_len, result.num_truncated_targets, max_target_len,
    )
    return result
