"""The runs that made a checkpoint, oldest first, so a model card can say what a model took in
all (steps, examples, hours, machines), not only what its last run did.

A run warm-started (`--init`) from a b2b checkpoint writes that checkpoint's runs to
`RUN/init_lineage.json` when it starts; a run checkpoint's lineage is those runs plus its own.
`train.export` ships the lineage as `lineage.json` beside the weights, so a run started from the
shipped folder carries it on. A Hugging Face BERT, or a checkpoint without a trainer state, has
no runs to carry.
"""
from __future__ import annotations

import json
import logging
import os

from b2b import runtime_info

from .checkpoints import STATE, TrainerState, read_run_settings, run_dir_of
from .init import init_folder
from .writer import read_run_starts

log = logging.getLogger(__name__)

LINEAGE = "lineage.json"  # in an exported checkpoint folder
INIT_LINEAGE = "init_lineage.json"  # in a run folder: the runs of the checkpoint it started from
_SETTINGS = ("batch_size", "lr", "max_steps", "label_smoothing", "seed")  # one run's recipe at a glance


def _hardware(rt: dict) -> str:
    """One machine as a run recorded it (`runtime_info()`): a GPU by its name, a CPU by its cores and BLAS."""
    where = f"{rt.get('platform', '?')}"
    if "cpu" in str(rt.get("device", "cpu")).lower():
        return f"{where} ({rt.get('cpu_count', '?')} CPU cores, MLX {rt.get('mlx', '?')}, BLAS {rt.get('blas', '?')})"
    return f"{where}, {rt.get('device_name') or rt.get('device')} (MLX {rt.get('mlx', '?')})"


def training_hardware(run_dir: str | None) -> str:
    """The machines a run trained on, as its metrics.jsonl recorded them at each start (a resumed
    run can move); this machine, said to be so, when the run recorded none."""
    if run_dir is None:
        return "not recorded (a checkpoint outside its run folder)"
    seen: list[str] = []
    for start in read_run_starts(run_dir):
        runtime = start.get("runtime")
        if isinstance(runtime, dict) and _hardware(runtime) not in seen:
            seen.append(_hardware(runtime))
    return " and ".join(seen) if seen else f"{_hardware(runtime_info())} (the exporting machine: the run recorded none)"


def run_record(checkpoint: str) -> dict:
    """What the run that wrote `checkpoint` did up to it (a checkpoint moved out of its run
    folder keeps its trainer state, but not its run's settings, machines or earlier runs)."""
    state = TrainerState.load(checkpoint)
    run_dir = run_dir_of(checkpoint)
    settings = read_run_settings(run_dir)
    return {
        "run": os.path.basename(run_dir or os.path.abspath(checkpoint)), "task": state.task or "summarization",
        "steps": state.step, "examples": state.examples_seen, "tokens": state.tokens_seen,
        "hours": round(state.wall_seconds / 3600, 3),
        "hardware": training_hardware(run_dir),
        "init": settings.get("init") or ("random" if run_dir else "not recorded"),
        "settings": {k: settings[k] for k in _SETTINGS if k in settings},
    }


def _read(path: str) -> list[dict]:
    """A lineage file's runs, checked: a list of objects whose counts are whole numbers."""
    with open(path, encoding="utf-8") as f:
        runs = json.load(f)
    if not isinstance(runs, list) or not all(isinstance(r, dict) for r in runs):
        raise ValueError(f"{path} is not a list of runs.")
    for r in runs:
        if not all(isinstance(r.get(k, 0), int) and not isinstance(r.get(k, 0), bool) for k in ("steps", "examples", "tokens")) \
                or not isinstance(r.get("hours", 0.0), (int, float)):
            raise ValueError(f"{path} has a run whose steps, examples, tokens or hours are not numbers.")
    return runs


def lineage_of(folder: str) -> list[dict]:
    """The runs that made the checkpoint in `folder`, oldest first ([] when nothing recorded any)."""
    shipped = os.path.join(folder, LINEAGE)
    if os.path.isfile(shipped):
        return _read(shipped)
    if not os.path.isfile(os.path.join(folder, STATE)):
        return []
    run_dir = run_dir_of(folder)
    before = os.path.join(run_dir, INIT_LINEAGE) if run_dir else ""
    return (_read(before) if before and os.path.isfile(before) else []) + [run_record(folder)]


def totals(runs: list[dict]) -> dict[str, float]:
    """Steps, examples, tokens and hours summed over `runs` (as `_read` checked them)."""
    return {k: sum(r.get(k, 0) for r in runs) for k in ("steps", "examples", "tokens", "hours")}


def write_init_lineage(run_dir: str, init: str) -> None:
    """Record, at a run's start, the runs behind the checkpoint it was warm-started from."""
    folder = init_folder(init)
    try:
        runs = lineage_of(folder) if folder else []
    except (OSError, ValueError) as e:  # a hand-edited file: the run goes on, its card counts only itself
        log.warning("The runs behind %s are not recorded (%s); this run's model card will count only itself.", init, e)
        runs = []
    path = os.path.join(run_dir, INIT_LINEAGE)
    if not runs:  # none to carry, and none left from an earlier start of this folder either
        if os.path.isfile(path):
            os.remove(path)
        return
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        json.dump(runs, f, indent=1)
    os.replace(path + ".tmp", path)


def summary_lines(runs: list[dict]) -> list[str]:
    """Markdown for a model card: the totals over `runs` and a table of them, one row a run."""
    hours: dict[str, float] = {}
    for r in runs:
        hours[r.get("hardware", "?")] = hours.get(r.get("hardware", "?"), 0.0) + r.get("hours", 0.0)
    machines = "; ".join(f"{h:.2f} h on {hw}" for hw, h in hours.items())
    total = totals(runs)
    lines = [
        f"In all, {len(runs)} runs, each from the one before: {total['steps']:,} optimizer steps, "
        f"{total['examples']:,} examples, {total['tokens']:,} tokens, {total['hours']:.2f} h in training loops: {machines}.",
        "",
        "| run | task | steps | examples | hours | machine | settings |",
        "|---|---|---:|---:|---:|---|---|",
    ]
    for r in runs:
        settings = ", ".join(f"{k}={v}" for k, v in (r.get("settings") or {}).items())
        lines.append(f"| {r.get('run', '?')} | {r.get('task', '?')} | {r.get('steps', 0):,} | {r.get('examples', 0):,} | "
                     f"{r.get('hours', 0.0):.2f} | {r.get('hardware', '?')} | {settings} |")
    return lines
