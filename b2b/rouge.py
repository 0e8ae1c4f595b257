"""ROUGE-1/2/Lsum: the one scoring function shared by training, the evaluation CLI and the app.

Both sides go through `detokenize` first: the CNN/DM references here are PTB-tokenized
(`did n't`) while decoded summaries read `didn't`, and rouge_score's tokenizer would count
`did n t` and `didn t` as different words. For Lsum, sentences are newline-separated, as
`rouge_score` expects (it does not split sentences itself unless asked to, which needs nltk data).
"""
from __future__ import annotations

import functools
import logging
from dataclasses import dataclass, field
from typing import Sequence

from rouge_score import rouge_scorer  # its Porter stemmer ships with nltk: no data download

from b2b.text import detokenize, split_sentences

ROUGE_TYPES = ("rouge1", "rouge2", "rougeLsum")


@dataclass
class RougeResult:
    """Mean F1 x 100 over examples, and the per-example F1 x 100."""

    rouge1: float
    rouge2: float
    rougeLsum: float
    per_example: list[dict] = field(default_factory=list)

    def to_dict(self) -> dict[str, float]:
        """The three means, keyed `rouge1`, `rouge2`, `rougeLsum` (ready for a metric writer)."""
        return {"rouge1": self.rouge1, "rouge2": self.rouge2, "rougeLsum": self.rougeLsum}


def _sentences(text: str | Sequence[str]) -> list[str]:
    """Clean sentences of a summary given as one string or as a list of sentences."""
    if isinstance(text, str):
        return [s for s in split_sentences(detokenize(text)) if s]
    if not all(isinstance(s, str) for s in text):
        raise ValueError("A summary must be a str or a list of str sentences.")
    return [s for s in (detokenize(s).strip() for s in text) if s]


def rouge_scores(predictions: list[str], references: list[str | list[str]]) -> RougeResult:
    """ROUGE F1 (x100) of each prediction against its reference, with Porter stemming.

    A reference may be a list of sentences (as in the PTB CNN/DM `highlights`).
    """
    if isinstance(predictions, str) or isinstance(references, str):
        raise ValueError("predictions and references must be lists of summaries, not one str.")
    if len(predictions) != len(references):
        raise ValueError(f"Got {len(predictions)} predictions but {len(references)} references.")
    if not predictions:
        raise ValueError("predictions and references are empty: nothing to score.")
    scorer = _scorer()
    per_example = []
    for pred, ref in zip(predictions, references):
        if not isinstance(pred, str):
            raise ValueError(f"Each prediction must be a str, got {type(pred).__name__}.")
        scores = scorer.score("\n".join(_sentences(ref)), "\n".join(_sentences(pred)))
        per_example.append({name: 100.0 * scores[name].fmeasure for name in ROUGE_TYPES})
    means = {name: sum(e[name] for e in per_example) / len(per_example) for name in ROUGE_TYPES}
    return RougeResult(**means, per_example=per_example)


@functools.lru_cache(maxsize=1)
def _scorer() -> rouge_scorer.RougeScorer:
    """One scorer per process (building one loads the stemmer). rouge_score logs "Using default
    tokenizer." at INFO through absl; under a progress bar that line only breaks the bar."""
    absl = logging.getLogger("absl")
    level = absl.level
    absl.setLevel(max(level, logging.WARNING))
    try:
        return rouge_scorer.RougeScorer(list(ROUGE_TYPES), use_stemmer=True)
    finally:
        absl.setLevel(level)


def lead3(article: str, n: int = 3) -> str:
    """The first `n` sentences of `article`, newline-joined (the standard extractive baseline)."""
    if not isinstance(article, str):
        raise ValueError(f"article must be a str, got {type(article).__name__}.")
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}.")
    return "\n".join(split_sentences(article)[:n])
