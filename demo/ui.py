"""Assemble the app: a header saying which model is served, one tab per module, and the named
API endpoints (`summarize`, `model_info`). Layout only; the work is in the tab modules."""
from __future__ import annotations

import os

import gradio as gr

from . import tab_attention, tab_rouge, tab_summarize, tab_training
from .store import TRAIN_FULL, CheckpointStore

TITLE = "b2b · BERT2BERT summarization"
HEADER_SECONDS = 3.0
CSS = """
#header-status { padding: 0.4rem 0.8rem; border-radius: 8px; background: var(--block-background-fill); }
#header-status p { margin: 0.15rem 0; }
.no-checkpoint { border-left: 4px solid #f59e0b; }
/* Gradio sets a highlighted word apart by 12px of margin (room for a category label, which
   scores have not): "swansea 's 3 -2" read spaced out. The text's own spaces are enough. */
#attention-highlight .token.highlighted { margin: 0; padding: var(--size-0-5) 0; }
"""
THEME = gr.themes.Soft(primary_hue="blue", neutral_hue="slate")


def shell_lines(command: str, width: int = 60) -> str:
    """A long shell command broken before its flags into lines of about `width` characters,
    each ending in a backslash: it reads without scrolling sideways and still pastes as one."""
    first, *flags = command.split(" --")
    lines = [first]
    for flag in flags:
        if len(lines[-1]) + 3 + len(flag) > width:
            lines.append("--" + flag)
        else:
            lines[-1] += " --" + flag
    return " \\\n    ".join(lines)


def header_markdown(store: CheckpointStore) -> str:
    """One line naming the served model (with a warning when a checkpoint was skipped), or the
    "no checkpoint yet" screen with the commands that make one."""
    served = store.current()
    warning = store.warning
    if served is None:
        text = (
            "### No checkpoint yet\n"
            "The app is running, but there is no model to serve. Train one and it appears here by "
            "itself (the app watches "
            f"`{store.watch_root if not store.pinned else store.pinned}`):\n\n"
            f"```bash\n# a few minutes on a laptop, tiny model, bundled sample data\n{shell_lines(store.train_hint)}\n\n"
            f"# the real thing: MiniLM warm start on CNN/DailyMail\n{shell_lines(TRAIN_FULL)}\n```\n"
            "or start the app on an existing checkpoint folder with `python app.py --checkpoint DIR`."
        )
    else:
        vals = served.val_metrics
        rouge = f" · val ROUGE-2 {vals['val/rouge2']:.2f}" if "val/rouge2" in vals else ""
        trained = f" · {t}" if (t := served.trained()) else ""
        text = (
            f"**Serving** {served.headline()}{rouge} · {served.num_parameters / 1e6:.1f} M parameters{trained} · "
            f"`{served.path}`"
        )
        if measured := served.measured():
            card = " · model card: `MODEL_CARD.md` in that folder" if os.path.isfile(os.path.join(served.path, "MODEL_CARD.md")) else ""
            text += f"  \n{measured}{card}"
    if warning:
        text += f"\n\n⚠️ {warning}"
    return text


def build_app(
    store: CheckpointStore,
    watch_root: str | None = "logs",
    concurrency: int | None = 2,
    refresh_seconds: float = tab_training.REFRESH_SECONDS,
) -> gr.Blocks:
    """The Gradio Blocks app around `store` (launch it with `theme=THEME, css=CSS`)."""
    with gr.Blocks(title=TITLE, analytics_enabled=False) as blocks:
        gr.Markdown(f"## {TITLE}")
        header = gr.Markdown(header_markdown(store), elem_id="header-status")
        with gr.Tabs():
            with gr.Tab("Summarize", id="summarize"):
                summ = tab_summarize.build(store, concurrency)
            with gr.Tab("Attention", id="attention"):
                tab_attention.build(store, summ.last, concurrency)
            with gr.Tab("ROUGE", id="rouge"):
                tab_rouge.build(store, concurrency)
            with gr.Tab("Training", id="training"):
                tab_training.build(blocks, store, watch_root, refresh_seconds)

        shown = gr.State("")

        def on_header(previous: str):
            text = header_markdown(store)
            return (gr.skip(), gr.skip()) if text == previous else (text, text)

        quiet = dict(show_progress="hidden", api_visibility="private", concurrency_limit=None)
        blocks.load(on_header, shown, [header, shown], **quiet)
        gr.Timer(HEADER_SECONDS).tick(on_header, shown, [header, shown], **quiet)

        tab_summarize.build_api(store, concurrency)

        def model_info() -> dict:
            """The served checkpoint (path, step, config summary) and the runtime (BLAS in use)."""
            return store.info()

        gr.api(model_info, api_name="model_info", concurrency_limit=None)
    return blocks
