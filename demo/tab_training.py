"""Training tab: which checkpoint is served, and live loss / ROUGE curves from a run's
`metrics.jsonl` (refreshed on a timer; TensorBoard reads the same folder)."""
from __future__ import annotations

import os
import shlex
import time

import gradio as gr

from train.writer import METRICS_FILE, read_metrics

from .figures import curves
from .store import CheckpointStore

LOSS_TAGS = ["train/loss", "val/loss"]
ROUGE_TAGS = ["val/rouge1", "val/rouge2", "val/rougeLsum"]
REFRESH_SECONDS = 5.0


def find_runs(root: str | None, max_depth: int = 2) -> list[str]:
    """Run folders (holding a metrics.jsonl) under `root`, most recently written first."""
    if not root or not os.path.isdir(root):
        return []
    found = []
    base = os.path.abspath(root).rstrip(os.sep).count(os.sep)
    for folder, subdirs, files in os.walk(os.path.abspath(root)):
        if METRICS_FILE in files:
            found.append(folder)
        if folder.count(os.sep) - base >= max_depth:
            subdirs[:] = []
        subdirs[:] = [d for d in subdirs if d not in ("checkpoints",) and not d.startswith(".")]
    return sorted(found, key=lambda f: os.path.getmtime(os.path.join(f, METRICS_FILE)), reverse=True)


def default_run(store: CheckpointStore, root: str | None) -> str | None:
    """The served checkpoint's run when it logged metrics, else the most recent run."""
    served = store.current()
    if served and served.run_dir and os.path.isfile(os.path.join(served.run_dir, METRICS_FILE)):
        return served.run_dir
    runs = find_runs(root)
    return runs[0] if runs else None


def served_markdown(store: CheckpointStore) -> str:
    """The served checkpoint: run, step, when loaded, its validation scores if known."""
    served = store.current()
    if served is None:
        text = f"**No checkpoint is served yet.** Train one with `{store.train_hint}`; the app loads it by itself."
    else:
        vals = served.val_metrics
        scores = ", ".join(f"{k.split('/', 1)[1]} {v:.2f}" for k, v in sorted(vals.items())) or "not recorded"
        state = served.trainer_state
        best = ""
        if state.get("best_metric") is not None:
            best = f" · best {state.get('metric_name') or 'metric'} {state['best_metric']:.3f} at step {state.get('best_step')}"
        text = (
            f"**Serving:** {served.headline()}  \n"
            f"**Checkpoint:** `{served.path}`  \n"
            f"**Loaded:** {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(served.loaded_at))}  \n"
            f"**Validation at that step:** {scores}{best}"
        )
        if trained := served.trained():
            card = " (its model card has each run)" if os.path.isfile(os.path.join(served.path, "MODEL_CARD.md")) else ""
            text += f"  \n**In all:** {trained}{card}"
        measured = served.measured()  # an exported model keeps no trainer state, but its eval reports
        if measured:
            text += f"  \n**Evaluated:** {measured}"
    if store.warning:
        text += f"\n\n⚠️ {store.warning}"
    return text


def tensorboard_command(root: str | None, run: str | None) -> str:
    logdir = root or (os.path.dirname(run) if run else "logs")
    return f"tensorboard --logdir {shlex.quote(logdir)}"


def _signature(run: str | None, store: CheckpointStore) -> tuple:
    served = store.current()
    try:
        st = os.stat(os.path.join(run, METRICS_FILE)) if run else None
    except OSError:
        st = None
    file = (st.st_mtime_ns, st.st_size) if st else None
    return (run, file, served.path if served else None, served.step if served else None)


def refresh(store: CheckpointStore, root: str | None, run_choice: str | None, seen: tuple | None):
    """Handler: (served markdown, runs dropdown, loss figure, ROUGE figure, tensorboard, seen).
    Figures are left alone (gr.skip) when neither the metrics file nor the served model changed."""
    runs = find_runs(root)
    run = run_choice if run_choice and os.path.isdir(run_choice) else default_run(store, root)
    choices = [(os.path.relpath(r, root) if root else r, r) for r in runs]
    if run and run not in runs:
        choices.insert(0, (run, run))
    signature = _signature(run, store)
    dropdown = gr.update(choices=choices, value=run)
    md = served_markdown(store)
    tb = f"Watch it in TensorBoard (same logs):\n\n```bash\n{tensorboard_command(root, run)}\n```"
    if seen == signature:
        return md, dropdown, gr.skip(), gr.skip(), tb, seen
    metrics = read_metrics(run) if run else {}
    served = store.current()
    step = served.step if served and served.run_dir == run else None
    where = f" — {os.path.basename(run)}" if run else ""
    empty = "No run yet: its metrics.jsonl appears here as soon as training logs." if not run else "Nothing logged yet."
    loss = curves(metrics, LOSS_TAGS, f"Loss{where}", "cross-entropy", empty, step)
    rouge = curves(metrics, ROUGE_TAGS, f"Validation ROUGE{where}", "F1 × 100", "No ROUGE evaluation logged yet.", step)
    return md, dropdown, loss, rouge, tb, signature


def build(
    blocks: gr.Blocks, store: CheckpointStore, root: str | None, refresh_seconds: float = REFRESH_SECONDS
) -> gr.Timer:
    """Lay out the tab inside the current gr.Tab; a page load and a timer refresh it."""
    served = gr.Markdown(served_markdown(store), elem_id="served-checkpoint")
    run = gr.Dropdown([], label="Run (a folder with metrics.jsonl)", allow_custom_value=True)
    with gr.Row():
        loss = gr.Plot(label="Loss")
        rouge = gr.Plot(label="ROUGE")
    tb = gr.Markdown()
    seen = gr.State(None)
    gr.Markdown(f"Curves refresh every {refresh_seconds:g} s from the run's `metrics.jsonl`.")
    timer = gr.Timer(refresh_seconds)

    def on_refresh(run_v, seen_v):
        return refresh(store, root, run_v, seen_v)

    outputs = [served, run, loss, rouge, tb, seen]
    opts = dict(show_progress="hidden", api_visibility="private", concurrency_limit=None)
    blocks.load(on_refresh, [run, seen], outputs, **opts)
    timer.tick(on_refresh, [run, seen], outputs, **opts)
    run.input(lambda r: refresh(store, root, r, None), [run], outputs, **opts)
    return timer

