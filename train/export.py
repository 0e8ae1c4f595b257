"""Package a run checkpoint for shipping: smaller weights (int8 / float16) and a model card.

    python -m train.export --checkpoint logs/cnndm-minilm/checkpoints/step_0001000 \\
        --out demo/checkpoint --dtype int8 [--average OTHER_CHECKPOINT ...]

The card is built from what the run recorded (settings.json, trainer_state.json, metrics and
any `eval_*.json` reports written by `train.evaluate` in the checkpoint folder)."""
from __future__ import annotations

import argparse
import dataclasses
import glob
import json
import logging
import os
import sys

import mlx.core as mx
from mlx.utils import tree_flatten

from b2b import Bert2Bert, Tokenizer, dtype_name, save_checkpoint

from .checkpoints import STATE, TrainerState, load_for_decoding, read_run_settings, run_dir_of
from .command import setup_logging
from .lineage import LINEAGE, lineage_of, summary_lines, training_hardware

log = logging.getLogger(__name__)

CREDITS = """## Credits and licences
- Warm start: all-MiniLM-L6-v2 / MiniLM (Wang et al. 2020), Apache-2.0, with the
  bert-base-uncased WordPiece vocabulary.
- Fine-tuning data: CNN/DailyMail (Hermann et al. 2015; See et al. 2017), articles (c) CNN and
  the Daily Mail, distributed for research (the Hugging Face dataset card lists apache-2.0).
- Architecture: BERT2BERT (Rothe, Narayan and Severyn, TACL 2020).
"""


def average_checkpoints(paths: list[str]) -> tuple[Bert2Bert, Tokenizer]:
    """The element-wise mean of the weights of `paths` (same architecture), with the first's
    tokenizer. Averaging the last few saves of a run smooths the noise of the final updates
    (Vaswani et al. 2017 averaged their last 5 to 20 checkpoints)."""
    if not paths:
        raise ValueError("No checkpoints to average.")
    model, tokenizer = load_for_decoding(paths[0], dtype="float32")
    total = dict(tree_flatten(model.parameters()))
    for path in paths[1:]:
        other, _ = load_for_decoding(path, dtype="float32")
        # Dropout is a training setting, not the shape of the weights: runs that changed it
        # (`--dropout`) still average.
        if dataclasses.replace(other.config, dropout=model.config.dropout) != model.config:
            raise ValueError(f"{path} has another architecture than {paths[0]} (config.json differs): cannot average them.")
        if other.trained_source_length != model.trained_source_length:
            raise ValueError(
                f"{path} was trained on {other.trained_source_length or 'all'} source tokens and {paths[0]} on "
                f"{model.trained_source_length or 'all'}: average checkpoints of one source length."
            )
        for name, w in tree_flatten(other.parameters()):
            total[name] = total[name] + w
    model.load_weights([(name, w / len(paths)) for name, w in total.items()])
    mx.eval(model.parameters())
    return model, tokenizer


def _constraints(settings: dict) -> str:
    """The decoding bans a report was made with, for its heading (reports from before a setting
    existed do not name it)."""
    named = [("no_repeat_word", "word-repeat bans"), ("source_spelling", "source spelling")]
    said = [f"{label} {'on' if settings[key] else 'off'}" for key, label in named if key in settings]
    return f" ({', '.join(said)})" if said else ""


def model_card(ckpt: str, model: Bert2Bert, dtype: str, averaged: list[str] | None = None,
               runs: list[dict] | None = None) -> str:
    """Markdown describing how `model`, loaded from `ckpt`, was made and how well it does;
    `averaged` lists the other checkpoints whose weights were averaged with `ckpt`'s, `runs` the
    runs that made `ckpt` (`lineage_of(ckpt)` when not given)."""
    has_state = os.path.isfile(os.path.join(ckpt, STATE))
    state = TrainerState.load(ckpt) if has_state else TrainerState()
    run_dir = run_dir_of(ckpt)
    settings = read_run_settings(run_dir)
    cfg = model.config
    pointer = ", with a pointer-generator (See et al. 2017) that copies source tokens" if cfg.pointer_generator else ""
    runs = lineage_of(ckpt) if runs is None else runs
    lines = [
        "# b2b summarizer (BERT2BERT, CNN/DailyMail)",
        "",
        f"A {'BERTShare' if cfg.share_encoder_decoder else 'BERT2BERT'} encoder-decoder "
        f"({cfg.encoder_layers}+{cfg.decoder_layers} layers, hidden {cfg.hidden_size}, {cfg.num_heads} heads, "
        f"{model.num_parameters() / 1e6:.1f}M parameters{pointer}), weights stored as {dtype}.",
        "",
        "## Training",
    ]
    if len(runs) > 1 or (runs and not has_state):  # say what it took in all; the last run's details follow if known
        lines += summary_lines(runs) + (["", "The last run:"] if has_state else [])
    if not has_state and not runs:
        lines.append("- No training record beside these weights (no trainer_state.json, no lineage.json).")
    if has_state:
        lines += [
            f"- Task: {state.task or 'summarization'}; optimizer steps: {state.step}; examples seen: {state.examples_seen:,}; "
            f"tokens seen: {state.tokens_seen:,}",
            f"- Wall time in the training loop: {state.wall_seconds / 3600:.2f} h on {training_hardware(run_dir)}",
            f"- Initialisation: {settings.get('init') or 'random'}",
            f"- Data: {settings.get('data', '?')} (validation: {settings.get('val_data') or 'held out'})",
            "- Settings: " + ", ".join(
                f"{k}={settings[k]}" for k in ("batch_size", "grad_accum", "lr", "warmup_steps", "schedule", "max_steps",
                                               "max_source_len", "max_target_len", "label_smoothing", "coverage", "dropout", "seed")
                if k in settings
            ),
        ]
    if averaged:
        names = ", ".join(os.path.basename(os.path.normpath(p)) for p in [ckpt, *averaged])
        lines.append(f"- Weights: the mean of {len(averaged) + 1} checkpoints' ({names}); the figures above are {os.path.basename(os.path.normpath(ckpt))}'s")
    lines += [
        "",
        "## Results",
    ]
    if state.last_eval:
        lines.append("Validation during training (the first pairs of the validation split; ROUGE, if any, by greedy decoding): "
                     + ", ".join(f"{k} {v}" for k, v in sorted(state.last_eval.items())))
    for path in sorted(glob.glob(os.path.join(ckpt, "eval_*.json"))):
        with open(path) as f:
            rep = json.load(f)
        m, l3, st = rep["model"], rep["lead3"], rep.get("settings", {})
        lines += [
            "",
            f"`{os.path.basename(path)}`: {rep['n']} articles of {st.get('data', '?')}, beams {st.get('num_beams', '?')}"
            + _constraints(st),
            "",
            "| | ROUGE-1 | ROUGE-2 | ROUGE-Lsum |",
            "|---|---|---|---|",
            f"| model | {m['rouge1']:.2f} | {m['rouge2']:.2f} | {m['rougeLsum']:.2f} |",
            f"| Lead-3 | {l3['rouge1']:.2f} | {l3['rouge2']:.2f} | {l3['rougeLsum']:.2f} |",
        ]
    lines += ["", "ROUGE: rouge-score F1 x 100, Porter stemmer, sentences split by newline (`b2b.rouge`).", "", CREDITS]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    setup_logging()
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--out", default="demo/checkpoint")
    p.add_argument("--dtype", default="int8", help="float32, float16, bfloat16 or int8 (aliases: fp16, bf16, ...)")
    p.add_argument("--notes", help="a Markdown file appended to the card (limitations, known problems)")
    p.add_argument("--average", nargs="+", default=[], metavar="CHECKPOINT",
                   help="average these checkpoints' weights with --checkpoint's (e.g. the run's previous saves); "
                        "the card's eval reports are the eval_*.json in --checkpoint's folder, so score the average first")
    a = p.parse_args(argv)
    try:
        if os.path.abspath(a.out) == os.path.abspath(a.checkpoint):
            raise ValueError(f"--out is --checkpoint's own folder ({a.out}): export to another folder, "
                             "or the eval reports and the lineage beside the weights would be lost.")
        a.dtype = dtype_name(a.dtype)
        model, tokenizer = average_checkpoints([a.checkpoint, *a.average]) if a.average else load_for_decoding(a.checkpoint)
        runs = lineage_of(a.checkpoint)
        if runs and a.average:  # the last run's figures are --checkpoint's; say its weights were averaged
            runs[-1] = {**runs[-1], "averaged_with": [os.path.basename(os.path.normpath(p)) for p in a.average]}
        card = model_card(a.checkpoint, model, a.dtype, a.average, runs)
        if a.notes:
            with open(a.notes, encoding="utf-8") as f:
                card += "\n" + f.read()
    except (ValueError, OSError) as e:
        log.error("%s", e)
        return 2
    # the lineage goes in with the weights (one atomic write): a run started from this folder carries it on
    path = save_checkpoint(model, tokenizer, a.out, dtype=None if a.dtype == "float32" else a.dtype,
                           extra={LINEAGE: runs} if runs else None)
    with open(os.path.join(path, "MODEL_CARD.md"), "w") as f:
        f.write(card)
    for report in glob.glob(os.path.join(a.checkpoint, "eval_*.json")):
        with open(report) as src, open(os.path.join(path, os.path.basename(report)), "w") as dst:
            dst.write(src.read())
    size = os.path.getsize(os.path.join(path, "model.safetensors")) / 2**20
    log.info("Wrote %s (%.1f MiB of weights) with MODEL_CARD.md.", path, size)
    return 0


if __name__ == "__main__":
    sys.exit(main())
