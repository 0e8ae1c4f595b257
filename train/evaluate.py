"""ROUGE evaluation shared by fine-tuning, the app's ROUGE tab and the command line:

    python -m train.evaluate --checkpoint DIR --data FILE [--limit N] [--num-beams K]

Scores the model and a Lead-3 baseline on the same articles with the same code
(b2b.rouge: ROUGE-1/2/Lsum F1, stemmed, sentences split by newline)."""
from __future__ import annotations

import argparse
import csv
import json
import logging
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from b2b import Bert2Bert, DecodingConfig, Tokenizer, lead3, rouge_scores, summarize

from .checkpoints import load_for_decoding
from .command import setup_logging
from .data import load_summarization_pairs

log = logging.getLogger(__name__)


@dataclass
class EvalReport:
    model: dict[str, float]  # rouge1, rouge2, rougeLsum (F1 x 100)
    lead3: dict[str, float]
    rows: list[dict] = field(default_factory=list)  # per example: article start, reference, generated, scores
    n: int = 0
    seconds: float = 0.0
    settings: dict = field(default_factory=dict)

    def table(self) -> str:
        lines = [f"{'':10} {'ROUGE-1':>8} {'ROUGE-2':>8} {'ROUGE-Lsum':>10}"]
        for name, sc in (("model", self.model), ("lead-3", self.lead3)):
            lines.append(f"{name:10} {sc['rouge1']:8.2f} {sc['rouge2']:8.2f} {sc['rougeLsum']:10.2f}")
        lines.append(f"{self.n} articles, {self.seconds:.0f} s")
        return "\n".join(lines)

    def to_dict(self) -> dict:
        return {"n": self.n, "seconds": round(self.seconds, 1), "model": self.model, "lead3": self.lead3, "settings": self.settings}

    def write_csv(self, path: str) -> None:
        with open(path, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(self.rows[0]))
            w.writeheader()
            w.writerows(self.rows)


def generate_summaries(
    model: Bert2Bert,
    tokenizer: Tokenizer,
    articles: list[str],
    batch_size: int = 8,
    progress: Callable[[int, int], None] | None = None,
    **decoding,
) -> list[str]:
    """Summaries for many articles, batched; articles are grouped by length (less padding)
    and returned in the input order. `progress(done, total)` is called after each batch."""
    order = np.argsort([len(a) for a in articles], kind="stable")
    out: list[str] = [""] * len(articles)
    for start in range(0, len(articles), batch_size):
        idx = order[start : start + batch_size]
        results = summarize(model, tokenizer, [articles[i] for i in idx], **decoding)
        for i, r in zip(idx, results):
            out[i] = r.text
        if progress:
            progress(min(start + batch_size, len(articles)), len(articles))
    return out


def evaluate_rouge(
    model: Bert2Bert,
    tokenizer: Tokenizer,
    articles: list[str],
    references: list[str],
    batch_size: int = 8,
    progress: Callable[[int, int], None] | None = None,
    lead3_scores: dict[str, float] | None = None,
    **decoding,
) -> EvalReport:
    """Generate, then score model and Lead-3 on the same articles with the same scorer.
    `lead3_scores` (a previous report's `lead3` for the same articles) skips rescoring Lead-3."""
    if not articles or len(articles) != len(references):
        raise ValueError("Need the same, non-zero number of articles and references.")
    start = time.perf_counter()
    generated = generate_summaries(model, tokenizer, articles, batch_size, progress, **decoding)
    scored = rouge_scores(generated, references)
    baseline = lead3_scores if lead3_scores is not None else _means(rouge_scores([lead3(a) for a in articles], references))
    rows = [
        {
            "article": a[:300],
            "reference": r,
            "generated": g,
            **{k: round(v, 2) for k, v in per.items()},
        }
        for a, r, g, per in zip(articles, references, generated, scored.per_example)
    ]
    return EvalReport(
        _means(scored), dict(baseline), rows, len(articles), time.perf_counter() - start, dict(decoding, batch_size=batch_size)
    )


def _means(r) -> dict[str, float]:
    return {"rouge1": round(r.rouge1, 2), "rouge2": round(r.rouge2, 2), "rougeLsum": round(r.rougeLsum, 2)}


def _default_report_path(checkpoint: str, data: str, limit: int, num_beams: int, skip: int = 0) -> str:
    """eval_<data>_<first N | all | from M>_beam<K>.json in the checkpoint folder: a quick run on a
    few articles must not overwrite the report of a long one (the app and export read eval_*.json)."""
    articles = f"first{limit}" if limit else "all"
    if skip:
        articles = f"from{skip + 1}" + (f"_{limit}" if limit else "")
    return os.path.join(checkpoint, f"eval_{os.path.basename(data).split('.')[0]}_{articles}_beam{num_beams}.json")


def main(argv: list[str] | None = None) -> int:
    setup_logging()
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", required=True, help="b2b checkpoint folder")
    p.add_argument("--data", required=True, help="JSONL / JSONL.GZ / CSV / Parquet file, or a hub dataset name")
    p.add_argument("--split", default="test", help="the split of a hub dataset (default: test; local files have none)")
    p.add_argument("--article-field", default="article", help="the article's field or column (default: article)")
    p.add_argument("--summary-field", default="highlights", help="the reference summary's field or column (default: highlights)")
    p.add_argument("--limit", type=int, default=1000, help="first N articles (0: all)")
    p.add_argument("--skip", type=int, default=0, help="start after the first N articles (e.g. --skip 1000 --limit 1000: articles 1,001-2,000)")
    p.add_argument("--num-beams", type=int, default=1, help="1: greedy (default); more: beam search")
    p.add_argument("--max-length", type=int, default=128, help="most summary tokens (default: 128)")
    p.add_argument("--min-length", type=int, default=0, help="fewest summary tokens (default: 0)")
    p.add_argument("--length-penalty", type=float, default=1.0, help="beam scores are divided by length ** this (default: 1)")
    p.add_argument("--no-repeat-ngram-size", type=int, default=3, help="no n-gram of this size twice (default: 3; 0: off)")
    p.add_argument("--coverage-penalty", type=float, default=DecodingConfig.coverage_penalty,
                   help="beam search, pointer models: charge copy attention spent past 1 on a source position (0: off)")
    p.add_argument("--repetition-penalty", type=float, default=1.0, help="as transformers' generate; 1: off")
    p.add_argument("--allow-word-repeats", action="store_true", help="let a word or phrase follow itself (\"texas, texas\"); banned by default")
    p.add_argument("--free-spelling", action="store_true",
                   help="let a word written over several WordPieces spell what the source does not (\"maysled\" for \"maysles\"); banned by default")
    p.add_argument("--max-source-length", type=int, default=0,
                   help="source tokens read (0: the length the checkpoint was trained on, from its decoding.json, else all its positions)")
    p.add_argument("--batch-size", type=int, default=8, help="articles decoded together (default: 8)")
    p.add_argument("--out", default="", help="write the report as JSON here (and per-example CSV beside it); default: eval_<data>_first<N>_beam<K>.json in the checkpoint folder")
    a = p.parse_args(argv)
    try:
        from tqdm import tqdm

        if a.skip < 0 or a.limit < 0:
            raise ValueError(f"--skip and --limit cannot be negative (got {a.skip} and {a.limit}).")
        if a.batch_size < 1:
            raise ValueError(f"--batch-size must be at least 1, got {a.batch_size}.")
        decoding = dict(
            num_beams=a.num_beams, max_length=a.max_length, min_length=a.min_length,
            length_penalty=a.length_penalty, no_repeat_ngram_size=a.no_repeat_ngram_size,
            repetition_penalty=a.repetition_penalty, coverage_penalty=a.coverage_penalty, no_repeat_word=not a.allow_word_repeats,
            source_spelling=not a.free_spelling,
        )
        DecodingConfig.from_kwargs(**decoding)  # a bad setting is an error now, not after loading
        if a.out:
            _check_writable(a.out)
        out = a.out or _default_report_path(a.checkpoint, a.data, a.limit, a.num_beams, a.skip)  # in the checkpoint folder
        model, tokenizer = load_for_decoding(a.checkpoint)
        data = load_summarization_pairs(a.data, a.article_field, a.summary_field, split=a.split, limit=(a.skip + a.limit) or None)
        if a.skip:
            if a.skip >= len(data):
                raise ValueError(f"--skip {a.skip} leaves no articles: {data.source} has {len(data)} usable pairs.")
            data.articles, data.summaries = data.articles[a.skip :], data.summaries[a.skip :]
        bar = tqdm(total=len(data), desc="summarizing", dynamic_ncols=True)
        report = evaluate_rouge(
            model, tokenizer, data.articles, data.summaries, a.batch_size,
            progress=lambda done, total: bar.update(done - bar.n), **decoding,
            max_source_length=a.max_source_length or model.source_limit,  # the report names the length used
        )
        bar.close()
    except (ValueError, FileNotFoundError) as e:
        log.error("%s", e)
        return 2
    report.settings.update(checkpoint=os.path.abspath(a.checkpoint), data=a.data, limit=a.limit, skip=a.skip)
    print(report.table())
    rc = 0
    try:
        with open(out, "w") as f:
            json.dump(report.to_dict(), f, indent=2)
        report.write_csv(os.path.splitext(out)[0] + ".csv")
        print(f"wrote {out}")
    except OSError as e:
        log.error("Could not write the report to %s: %s", out, e)
        rc = 1
    print(json.dumps(report.to_dict()))  # the scores reach the screen even when the file could not be written
    return rc


def _check_writable(out: str) -> None:
    """Make the report's folder, so a typo in --out fails before a long run, not after it."""
    folder = os.path.dirname(os.path.abspath(out))
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as e:
        raise ValueError(f"Cannot write the report to {out}: {e.strerror or e}.") from e
    if not os.access(folder, os.W_OK):
        raise ValueError(f"Cannot write the report to {out}: the folder {folder} is not writable.")


if __name__ == "__main__":
    sys.exit(main())
