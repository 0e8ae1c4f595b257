"""ROUGE tab: score the served model and a Lead-3 baseline on the bundled CNN/DM sample or an
uploaded JSONL/CSV, with the same code as training (`train.evaluate.evaluate_rouge`)."""
from __future__ import annotations

import contextlib
import os
import queue
import re
import tempfile
import threading
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Iterator

import gradio as gr
import pandas as pd

from train.data import load_summarization_pairs
from train.evaluate import EvalReport, evaluate_rouge

from .controls import EVAL_DEFAULTS, StopFlag, build_decoding_controls, busy, wire_stoppable
from .data import SAMPLE_SET, SAMPLE_SIZE
from .errors import ui_errors
from .figures import ROUGE_NAMES, empty_figure, rouge_bars
from .store import CheckpointStore
from .validate import BadInput, check_data_file, data_fields, decoding_kwargs

SAMPLE, UPLOAD = f"Bundled sample ({SAMPLE_SIZE} CNN/DailyMail validation articles)", "Uploaded file"
MAX_EXAMPLES = 1000
ARTICLE_GUESSES = ("article", "document", "text", "source", "story")
REFERENCE_GUESSES = ("highlights", "summary", "reference", "abstract", "target", "headline")
TABLE_HEADERS = ["article (start)", "reference", "generated", *ROUGE_NAMES.values()]
POLL_SECONDS = 0.25  # how often the waiting handler reports progress (and can be stopped)
NOT_RUN = "Run an evaluation to compare the model with Lead-3."
STOPPED = ("**Stopped:** the evaluation did not finish, so there are no scores (those of the first few "
           "articles would not compare with a full run). Press **Evaluate** to start again.")


class EvalStopped(Exception):
    """Raised on the model worker between two batches once the evaluation was stopped."""


@dataclass
class EvalOutput:
    summary: str
    figure: object
    table: pd.DataFrame
    csv_path: str
    report: EvalReport


def guess_fields(fields: list[str]) -> tuple[str | None, str | None]:
    """The article and reference fields of a pairs file, found by name (ARTICLE_GUESSES,
    REFERENCE_GUESSES, any case); None for one that is not there: never a guess by position."""
    lower = {f.lower(): f for f in fields}
    article = next((lower[g] for g in ARTICLE_GUESSES if g in lower), None)
    reference = next((lower[g] for g in REFERENCE_GUESSES if g in lower), None)
    return article, reference


def missing_fields_sentence(name: str, fields: list[str]) -> str:
    """Why a pairs file is not scored as it is: the fields found and the names accepted."""
    article, reference = guess_fields(fields)
    which = " and ".join(w for w, f in (("article", article), ("reference", reference)) if f is None) or "usable"
    return (
        f"{name} has no {which} field with a name the app knows (its fields are: {', '.join(fields) or 'none'}); "
        f"name the article field one of {', '.join(ARTICLE_GUESSES)} and the reference field one of "
        f"{', '.join(REFERENCE_GUESSES)}, or choose both fields in the lists."
    )


def _articles(n: int) -> str:
    return f"{n} article" + ("" if n == 1 else "s")


def summary_markdown(report: EvalReport, headline: str) -> str:
    rows = ["| | " + " | ".join(ROUGE_NAMES.values()) + " |", "|---|---:|---:|---:|"]
    for name, scores in (("**model**", report.model), ("Lead-3", report.lead3)):
        rows.append(f"| {name} | " + " | ".join(f"{scores[k]:.2f}" for k in ROUGE_NAMES) + " |")
    return (
        "\n".join(rows)
        + f"\n\n{_articles(report.n)} in {report.seconds:.1f} s with {headline}. "
        "F1 × 100, stemmed; ROUGE-Lsum splits sentences at newlines."
    )


def report_table(report: EvalReport) -> pd.DataFrame:
    df = pd.DataFrame(report.rows)
    df["article"] = [a if len(a) <= 200 else a[:200] + "…" for a in df["article"]]
    return df.rename(columns={"article": "article (start)", **ROUGE_NAMES})


def eval_steps(
    store: CheckpointStore,
    source: str,
    upload: str | None,
    article_field: str | None,
    reference_field: str | None,
    n: float,
    batch_size: float,
    decoding: list,
    progress=None,
    out_dir: str | None = None,
    stop: threading.Event | None = None,
) -> Iterator[tuple[int, int] | EvalOutput]:
    """`run_eval` step by step: (articles done, total) about every POLL_SECONDS while the model
    works, then the EvalOutput. Closing the generator early (on Stop, or when the page goes
    away) sets `stop`, and the evaluation ends after the batch in progress, so the worker is
    free for the next request rather than busy with minutes of unwanted batches."""
    stop = stop or threading.Event()
    kw = decoding_kwargs(*decoding)
    n = int(n or 0)
    if not 1 <= n <= MAX_EXAMPLES:
        raise BadInput(f"N must be between 1 and {MAX_EXAMPLES}, not {n}.")
    path = SAMPLE_SET if source == SAMPLE else check_data_file(upload)
    if not article_field or not reference_field:
        if source != SAMPLE and None in guess_fields(fields := data_fields(path)):
            raise BadInput(missing_fields_sentence(os.path.basename(path), fields))
        raise BadInput("Choose the article field and the reference field.")
    if article_field == reference_field:
        raise BadInput("The article and the reference must be different fields.")
    served = store.require()
    data = load_summarization_pairs(path, article_field, reference_field, limit=n)  # DataError: one sentence
    updates: queue.SimpleQueue = queue.SimpleQueue()

    def after_batch(done: int, total: int) -> None:  # on the worker, between two batches
        if stop.is_set():
            raise EvalStopped(f"Stopped after {done} of {total} articles.")
        updates.put((done, total))
        store.worker.yield_to_interactive()  # summaries requested meanwhile go first

    future = store.worker.submit(
        evaluate_rouge, served.model, served.tokenizer, data.articles, data.summaries,
        batch_size=int(batch_size or 8), progress=after_batch, background=True, **kw,
    )
    done, total = 0, len(data.articles)
    if progress is not None:
        progress((done, total), desc="Summarizing", unit="articles")
    try:
        while True:  # the model runs on the worker thread; progress is reported from this one
            try:
                report = future.result(timeout=POLL_SECONDS)
                break
            except FutureTimeout:
                pass
            finally:
                while not updates.empty():
                    done, total = updates.get()
                    if progress is not None:
                        progress((done, total), desc="Summarizing", unit="articles")
            yield done, total
    finally:
        if not future.done():  # closed early: drop the job if it has not started, else end it
            stop.set()
            future.cancel()
    out_dir = out_dir or tempfile.mkdtemp(prefix="b2b-rouge-")
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", f"rouge_{served.run}_{len(data.articles)}.csv")
    csv_path = os.path.join(out_dir, name)
    report.write_csv(csv_path)
    yield EvalOutput(
        summary_markdown(report, served.headline()), rouge_bars(report.model, report.lead3, report.n),
        report_table(report), csv_path, report,
    )


def run_eval(*args, **kwargs) -> EvalOutput:
    """`eval_steps` run to the end (same parameters): load N pairs, generate in batches
    (reporting progress(done, total)), score, write the CSV."""
    *_, out = eval_steps(*args, **kwargs)
    return out


def evaluate_stream(store: CheckpointStore, stop: threading.Event, *args, **kwargs) -> Iterator[tuple]:
    """Handler: (summary, plot, table, CSV) as `eval_steps(store, *args, **kwargs)` goes: its
    progress in the summary, then the results. Once `stop` is set (the Stop button) the
    stopped outputs within POLL_SECONDS; the evaluation ends after the batch in progress."""
    shown = None
    with contextlib.closing(eval_steps(store, *args, **kwargs)) as steps:
        for out in steps:
            if isinstance(out, EvalOutput):
                yield out.summary, out.figure, out.table, out.csv_path
            elif stop.is_set():
                yield stopped()
                return
            elif out != shown:  # once a generator yields, Gradio shows no progress bar: say it here
                shown = out
                yield f"Summarizing… {out[0]} of {_articles(out[1])} done.", gr.skip(), gr.skip(), gr.skip()


def _no_rows() -> pd.DataFrame:
    """The per-example table with its headers and no rows (None would show "1 2 3")."""
    return pd.DataFrame(columns=TABLE_HEADERS)


def started() -> tuple:
    """(summary, plot, table, CSV, Evaluate, Stop) as a run starts: the previous results go at
    once, so a run that fails or is stopped never shows the last one's scores."""
    return "", empty_figure("ROUGE", NOT_RUN), _no_rows(), None, *busy()


def stopped() -> tuple:
    """(summary, plot, table, CSV) after Stop: no partial scores."""
    return STOPPED, empty_figure("ROUGE", "Stopped: no scores."), _no_rows(), None


def build(store: CheckpointStore, concurrency: int | None = 2) -> None:
    """Lay out the tab inside the current gr.Tab and wire its events."""
    gr.Markdown(
        "Score the served model against the references, next to a **Lead-3** baseline (the "
        "article's first three sentences), with the same ROUGE code as training."
    )
    with gr.Row(equal_height=False):
        with gr.Column(scale=2):
            source = gr.Radio([SAMPLE, UPLOAD], value=SAMPLE, label="Articles")
            upload = gr.File(
                label="JSONL or CSV with an article and a reference per row",
                file_types=[".jsonl", ".json", ".csv", ".gz"], visible=False, height=130, elem_id="rouge-upload",
            )
            with gr.Row():
                article_field = gr.Dropdown(["article"], value="article", label="Article field", allow_custom_value=True)
                reference_field = gr.Dropdown(
                    ["highlights"], value="highlights", label="Reference field", allow_custom_value=True
                )
            with gr.Row():
                n = gr.Slider(1, SAMPLE_SIZE, value=10, step=1, label="N (first N articles)")
                batch_size = gr.Slider(1, 32, value=8, step=1, label="Batch size")
            controls = build_decoding_controls(EVAL_DEFAULTS)
            with gr.Row():
                button = gr.Button("Evaluate", variant="primary", scale=3, elem_id="rouge-btn")
                stop = gr.Button("Stop", variant="stop", scale=1, interactive=False, elem_id="rouge-stop")
        with gr.Column(scale=3):
            summary = gr.Markdown("Results appear here.", elem_id="rouge-summary", min_height=120)
            plot = gr.Plot(empty_figure("ROUGE", NOT_RUN), label="ROUGE")
    table = gr.Dataframe(
        label="Per example", wrap=True, max_height=520, interactive=False, elem_id="rouge-table",
        headers=TABLE_HEADERS,  # not "1 2 3" before a run
        datatype=["str", "str", "str", "number", "number", "number"],
        column_widths=["28%", "26%", "26%", "6%", "6%", "8%"],
    )
    csv_file = gr.File(label="Download the per-example scores (CSV)", interactive=False)

    def on_source(choice):
        sample = choice == SAMPLE
        fields = ["id", "article", "highlights"]
        return (
            gr.update(visible=not sample),
            gr.update(choices=fields, value="article") if sample else gr.skip(),
            gr.update(choices=fields, value="highlights") if sample else gr.skip(),
            gr.update(maximum=SAMPLE_SIZE) if sample else gr.update(maximum=MAX_EXAMPLES),
        )

    @ui_errors("reading the uploaded file")
    def on_upload(path):
        try:
            fields = data_fields(path)
        except BadInput as e:  # a toast; the widget is emptied for the next try
            gr.Warning(str(e), title="File not loaded")
            return gr.skip(), gr.skip(), None
        article, reference = guess_fields(fields)
        if article is None or reference is None:  # not scored until the person picks the fields
            gr.Warning(missing_fields_sentence(os.path.basename(path), fields), title="Which fields?")
        return gr.update(choices=fields, value=article), gr.update(choices=fields, value=reference), gr.skip()

    stop_flag = gr.State(StopFlag())

    # Gradio hands gr.Progress only to a positional parameter: the decoding values are spelled out.
    # A generator: it reports progress, and sees a Stop within POLL_SECONDS.
    @ui_errors("evaluating")
    def on_evaluate(
        flag, source_v, upload_v, article_v, reference_v, n_v, batch_v,
        strategy, num_beams, length_penalty, no_repeat_ngram_size, min_length, max_length,
        temperature, top_k, top_p, seed, repetition_penalty, no_repeat_word, coverage_penalty, source_spelling,
        progress=gr.Progress(),  # noqa: B008 - gradio's idiom
    ):
        decoding = [
            strategy, num_beams, length_penalty, no_repeat_ngram_size, min_length, max_length, temperature, top_k, top_p, seed,
            repetition_penalty, no_repeat_word, coverage_penalty, source_spelling,
        ]
        yield from evaluate_stream(store, flag, source_v, upload_v, article_v, reference_v, n_v, batch_v, decoding, progress)

    source.change(on_source, source, [upload, article_field, reference_field, n], queue=False, api_visibility="private")
    upload.upload(
        on_upload, upload, [article_field, reference_field, upload], api_visibility="private", show_progress="hidden"
    )
    results = [summary, plot, table, csv_file]
    wire_stoppable(
        button, stop, stop_flag, started, results,
        dict(fn=on_evaluate, inputs=[stop_flag, source, upload, article_field, reference_field, n, batch_size, *controls.inputs],
             outputs=results, concurrency_limit=concurrency, concurrency_id="model", api_visibility="private",
             show_progress_on=[summary]),  # the progress bar (and an error) on the results, not on every output
    )
