"""Print the initialisation ablation (bench/ablation.sh) as a Markdown table.

    python -m bench.ablation_table logs/ablation
"""
from __future__ import annotations

import json
import sys

from train.checkpoints import TrainerState, list_checkpoints

ARMS = [
    ("ft_random", "random initialisation (minilm shape)"),
    ("ft_own_mlm", "own encoder, MLM-pretrained on WikiText-2"),
    ("ft_minilm", "MiniLM warm start, BERT2BERT"),
    ("ft_minilm_share", "MiniLM warm start, BERTShare"),
]


def rows(out_dir: str) -> list[dict]:
    found = []
    for name, label in ARMS:
        kept = list_checkpoints(f"{out_dir}/{name}")
        if not kept:
            continue
        state = TrainerState.load(kept[-1][1])
        ev = state.last_eval
        found.append({
            "arm": label, "steps": state.step, "examples": state.examples_seen,
            "val_loss": ev.get("val/loss"), "rouge1": ev.get("val/rouge1"),
            "rouge2": ev.get("val/rouge2"), "rougeLsum": ev.get("val/rougeLsum"),
            "minutes": state.wall_seconds / 60,
        })
    return found


def main(argv: list[str]) -> None:
    out_dir = argv[0] if argv else "logs/ablation"
    table = rows(out_dir)
    if not table:
        sys.exit(f"No finished ablation arms under {out_dir}: run bash bench/ablation.sh {out_dir} first.")
    mlm = list_checkpoints(f"{out_dir}/mlm_wikitext2")
    if mlm:
        st = TrainerState.load(mlm[-1][1])
        print(f"MLM pretraining: {st.step} steps, {st.tokens_seen:,} tokens, val {json.dumps(st.last_eval)}\n")
    fmt = lambda v, p=2: "-" if v is None else f"{v:.{p}f}"  # noqa: E731
    print("| initialisation | steps | examples | val loss | ROUGE-1 | ROUGE-2 | ROUGE-Lsum | train min |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in table:
        print(f"| {r['arm']} | {r['steps']} | {r['examples']} | {fmt(r['val_loss'], 3)} | {fmt(r['rouge1'])} | "
              f"{fmt(r['rouge2'])} | {fmt(r['rougeLsum'])} | {r['minutes']:.1f} |")
    print(json.dumps(table))


if __name__ == "__main__":
    main(sys.argv[1:])
