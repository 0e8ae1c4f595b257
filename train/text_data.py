"""Plain-text documents for MLM/NSP pre-training: WikiText-style files, folders or hub datasets,
packed into fixed-size blocks or next-sentence pairs (int32 numpy; no MLX here)."""
from __future__ import annotations

import logging
import os
import re
from typing import Sequence

import numpy as np

from .data import PAIR_SUFFIXES, TEXT_SUFFIXES, DataError, DataFileNotFound, TokenizerLike, files_for_split, load_hub, looks_like_path

log = logging.getLogger(__name__)

# ` = Title = ` opens a WikiText article; ` = = Section = = ` lines stay inside it.
_WIKI_TITLE = re.compile(r"^ ?= [^=].* = ?$")
_WIKI_HEADING = re.compile(r"^ ?(= )+.* (= ?)+$")


# --------------------------------------------------------------------------- plain text


def split_documents(lines: Sequence[str]) -> list[str]:
    """Lines -> documents. With WikiText ` = Title = ` lines, each title opens a document made
    of the paragraphs (one per line) under it; headings and blank lines are dropped. Without
    titles, blank lines separate documents."""
    docs: list[str] = []
    current: list[str] = []
    wikitext = any(_WIKI_TITLE.match(line.rstrip("\n")) for line in lines)
    for raw in lines:
        line = raw.rstrip("\n")
        text = line.strip()
        if wikitext:
            if _WIKI_TITLE.match(line):
                if current:
                    docs.append("\n".join(current))
                current = []
            elif text and not _WIKI_HEADING.match(line):
                current.append(text)
        elif text:
            current.append(text)
        elif current:
            docs.append("\n".join(current))
            current = []
    if current:
        docs.append("\n".join(current))
    return docs


def load_text_documents(
    source: str, split: str = "train", config: str | None = None, limit: int | None = None
) -> list[str]:
    """Documents from a .txt/.tokens/.raw file, a folder of them (the files of `split` when
    their names say), or a hub dataset with a `text` column (e.g. `wikitext`,
    `wikitext-2-raw-v1`). At most `limit` documents."""
    if os.path.isdir(source):
        files = files_for_split(source, TEXT_SUFFIXES, split)
        if not files:
            raise DataError(f"The folder {source} has no {'/'.join(TEXT_SUFFIXES)} files for split {split!r}.")
    elif os.path.isfile(source):
        if source.lower().endswith(PAIR_SUFFIXES):  # what train.finetune reads
            raise DataError(
                f"{source} holds records (JSON/CSV/Parquet), not plain text: pretraining reads .txt, .tokens or .raw "
                "files, one paragraph a line (article/summary pairs are for train.finetune)."
            )
        files = [source]
    elif looks_like_path(source):
        raise DataFileNotFound(f"The text file {source} does not exist.")
    else:
        ds = load_hub(source, config, split, None)
        if "text" not in ds.column_names:
            raise DataError(f"The dataset {source!r} has no 'text' column; it has: {', '.join(ds.column_names)}.")
        rows = list(ds["text"])
        # WikiText on the hub is one line per row; other corpora are one document per row.
        if any(_WIKI_TITLE.match(r.rstrip("\n")) for r in rows[:2000]):
            docs = split_documents(rows)
        else:
            docs = [r.strip() for r in rows if r.strip()]
        return _nonempty(docs[:limit], source)
    docs = []
    for path in files:
        with open(path, encoding="utf-8") as f:
            docs += split_documents(f.readlines())
        if limit is not None and len(docs) >= limit:
            break
    log.info("Read %d documents from %d file(s) under %s.", len(docs[:limit]), len(files), source)
    return _nonempty(docs[:limit], source)


def _nonempty(docs: list[str], source: str) -> list[str]:
    if not docs:
        raise DataError(f"{source} contains no text documents.")
    return docs


# --------------------------------------------------------------------------- pre-training


def _tokenize_docs(docs: list[str], tokenizer: TokenizerLike) -> list[np.ndarray]:
    return [np.asarray(ids, dtype=np.int32) for ids in tokenizer.encode_plain(list(docs))]


def pack_mlm_blocks(
    docs: list[str], tokenizer: TokenizerLike, block_size: int, min_tokens: int = 8
) -> np.ndarray:
    """(N, block_size) int32 blocks `[CLS] tokens [SEP] [PAD]...`, each from ONE document (a
    block never mixes two); only a document's last block is short, and dropped when under
    `min_tokens` tokens (too little context to learn from)."""
    if block_size < 4:
        raise ValueError(f"block_size must be at least 4, got {block_size}.")
    body = block_size - 2
    pieces: list[np.ndarray] = []
    for ids in _tokenize_docs(docs, tokenizer):
        for start in range(0, len(ids), body):
            piece = ids[start : start + body]
            if len(piece) >= min(min_tokens, body):
                pieces.append(piece)
    if not pieces:
        raise DataError(f"No document has at least {min_tokens} tokens, so there is nothing to pre-train on.")
    blocks = np.full((len(pieces), block_size), tokenizer.pad_id, dtype=np.int32)
    for row, piece in zip(blocks, pieces):
        row[0] = tokenizer.cls_id
        row[1 : len(piece) + 1] = piece
        row[len(piece) + 1] = tokenizer.sep_id
    return blocks  # (N, block_size)


def make_nsp_pairs(
    docs: list[str], tokenizer: TokenizerLike, block_size: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Next-sentence pairs `[CLS] A [SEP] B [SEP]`: A is a segment of a document, B the segment
    that follows it with probability 1/2 (is_next=1), else a random segment of another document
    (is_next=0). Returns ids (N, T), segment_ids (N, T) (0 for `[CLS] A [SEP]`, 1 for `B [SEP]`,
    0 on padding) and is_next (N,), all int32."""
    half = (block_size - 3) // 2  # room for [CLS] A [SEP] B [SEP]
    if half < 1:
        raise ValueError(f"block_size must be at least 5 for NSP pairs, got {block_size}.")
    segments = [[ids[i : i + half] for i in range(0, len(ids), half)] for ids in _tokenize_docs(docs, tokenizer)]
    usable = [d for d, segs in enumerate(segments) if segs]
    if len(usable) < 2:
        raise DataError("NSP pairs need at least two non-empty documents for the random-segment half.")
    anchors = [(d, i) for d in usable for i in range(len(segments[d]) - 1)]
    if not anchors:
        raise DataError(f"No document is longer than {half} tokens, so no segment has a true next segment.")
    n = len(anchors)
    is_next = (rng.random(n) < 0.5).astype(np.int32)
    other_doc = rng.integers(0, len(usable) - 1, size=n)
    ids = np.full((n, block_size), tokenizer.pad_id, dtype=np.int32)
    seg = np.zeros((n, block_size), dtype=np.int32)
    position = {d: k for k, d in enumerate(usable)}
    for row, ((d, i), nxt, pick) in enumerate(zip(anchors, is_next, other_doc)):
        a = segments[d][i]
        if nxt:
            b = segments[d][i + 1]
        else:
            other = usable[pick + (pick >= position[d])]  # any usable document but this one
            b = segments[other][rng.integers(len(segments[other]))]
        la, lb = len(a), len(b)
        ids[row, 0] = tokenizer.cls_id
        ids[row, 1 : 1 + la] = a
        ids[row, 1 + la] = tokenizer.sep_id
        ids[row, 2 + la : 2 + la + lb] = b
        ids[row, 2 + la + lb] = tokenizer.sep_id
        seg[row, 2 + la : 3 + la + lb] = 1
    return ids, seg, is_next
