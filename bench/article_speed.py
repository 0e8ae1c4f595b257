"""Seconds an article and tokens a second of `b2b.summarize`, one article at a time, for
checkpoints side by side (e.g. the shipped model before and after a change):

    python -m bench.article_speed demo/checkpoint OTHER_CHECKPOINT --articles 8

Weights are rounded to float16 values, as a float16 checkpoint loads, so every checkpoint takes
the same decoding path. Each (checkpoint, beams) row decodes one article first to warm up."""
from __future__ import annotations

import argparse
import sys
import time

import b2b  # noqa: F401 - preloads the BLAS before mlx.core
import mlx.core as mx
from mlx.utils import tree_map

from train.data import load_summarization_pairs


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoints", nargs="+")
    p.add_argument("--data", default="../shared/data/cnndm/val.jsonl.gz", help="a file train.evaluate reads (JSONL(.GZ)/CSV with an article field)")
    p.add_argument("--articles", type=int, default=8)
    p.add_argument("--beams", default="1,4")
    p.add_argument("--max-source-length", type=int, default=320)
    p.add_argument("--coverage-penalties", default=str(b2b.DecodingConfig.coverage_penalty),
                   help="beam rows for each of these coverage penalties, e.g. 0,1 (pointer models)")
    a = p.parse_args(argv)
    penalties = [float(x) for x in a.coverage_penalties.split(",")]
    articles = load_summarization_pairs(a.data, split="validation", limit=a.articles).articles
    print(f"{'checkpoint':40} {'beams':>5} {'coverage':>8} {'s/article':>10} {'tokens/s':>9}")
    for path in a.checkpoints:
        model, tok = b2b.load_checkpoint(path)
        model.update(tree_map(lambda w: w.astype(mx.float16).astype(mx.float32), model.parameters()))
        rows = [(int(k), c) for k in a.beams.split(",") for c in (penalties if int(k) > 1 else penalties[:1])]
        for beams, coverage in rows:
            kw = dict(num_beams=beams, coverage_penalty=coverage, max_source_length=a.max_source_length)
            b2b.summarize(model, tok, articles[0], **kw)
            tokens, start = 0, time.perf_counter()
            for text in articles:
                tokens += b2b.summarize(model, tok, text, **kw).num_tokens
            seconds = time.perf_counter() - start
            shown = f"{coverage:8g}" if beams > 1 else f"{'-':>8}"
            print(f"{path[-40:]:40} {beams:5d} {shown} {seconds / len(articles):10.3f} {tokens / seconds:9.1f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
