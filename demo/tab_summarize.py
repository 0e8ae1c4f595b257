"""Summarize tab: paste or upload text, pick decoding settings, watch the summary stream in."""
from __future__ import annotations

import contextlib
import threading
import time
from dataclasses import dataclass
from typing import Iterator

import gradio as gr

from b2b import SummaryResult, stream_summarize, summarize

from .controls import SUMMARIZE_DEFAULTS, DecodingControls, StopFlag, build_decoding_controls, busy, wire_stoppable
from .data import example_label, load_examples
from .errors import ui_errors
from .store import CheckpointStore, Served
from .validate import BadInput, clip_text, decoding_kwargs, read_text_file, readable_text

STREAM_INTERVAL = 0.05  # seconds between UI updates while tokens arrive


def stats_markdown(r: SummaryResult, source_tokens: int, chars: int | None = None, read_chars: int | None = None) -> str:
    """Input size, truncation notice, time and speed of one summary; `chars`/`read_chars` say
    that a long text was cut to its first `read_chars` characters before tokenizing."""
    cut = chars is not None and read_chars is not None and read_chars < chars
    if cut:
        parts = [
            f"**Input:** {chars:,} characters, cut to the first {read_chars:,} before tokenizing "
            f"({r.num_input_tokens:,} tokens)"
        ]
    else:
        parts = [f"**Input:** {r.num_input_tokens:,} tokens"]
    if r.truncated or cut:
        parts.append(
            f"⚠️ **Truncated:** the model reads only the first {source_tokens} tokens; the rest of the text was ignored"
        )
    ended = "end of summary" if r.finish_reason == "eos" else "max length reached"
    parts.append(f"**Summary:** {r.num_tokens} tokens ({ended}) in {r.seconds:.2f} s · {r.tokens_per_sec:.1f} tokens/s")
    return "  \n".join(parts)


def _prepare(store: CheckpointStore, text: object, decoding: tuple) -> tuple[Served, str, dict]:
    """Check the request and pick its model: (served, text cut to what the model can read,
    decoding kwargs). BadInput or NoCheckpoint with one sentence."""
    served = store.current()  # one model for the whole request, even if a reload swaps it
    text, read = readable_text(text, served.model.source_limit if served else None)
    kw = decoding_kwargs(*decoding)
    if served is None:
        served = store.require()  # NoCheckpoint says how to get one
    return served, clip_text(read, served.model.source_limit), kw


def summarize_stream(store: CheckpointStore, text: str, *decoding, stop: threading.Event | None = None) -> Iterator[tuple]:
    """Handler: yields (summary so far, stats, attention-tab state); the state is only set at
    the end (gr.skip() before), so the Attention tab follows finished summaries. Once `stop` is
    set (the Stop button) it ends after the step in progress, with the summary so far."""
    served, read, kw = _prepare(store, text, decoding)
    yield "", "Generating…", gr.skip()
    last = 0.0
    steps = store.worker.iterate(lambda: stream_summarize(served.model, served.tokenizer, read, **kw))
    with contextlib.closing(steps):  # on a stop too: the worker drops the search at once
        for chunk in steps:
            r = chunk.result
            if r is None and stop is not None and stop.is_set():
                yield chunk.text, stopped_note(chunk.text), gr.skip()
                return
            if r is None:
                now = time.perf_counter()
                if now - last >= STREAM_INTERVAL:
                    last = now
                    yield chunk.text, f"Generating… {len(chunk.token_ids)} tokens", gr.skip()
                continue
            state = {
                "text": read,
                "summary": r.text,
                "summary_ids": list(r.token_ids),
                "ended": r.finish_reason == "eos",
                "checkpoint": served.path,
                "model": served.identity,  # the Attention tab must use these weights, not a newer swap
                "headline": served.headline(),
            }
            summary = r.text if r.text.strip() else "(the model produced an empty summary)"
            yield summary, stats_markdown(r, served.model.source_limit, len(text), len(read)), state


def summarize_text(store: CheckpointStore, text: str, *decoding) -> str:
    """Handler for the `summarize` API: the finished summary only."""
    served, read, kw = _prepare(store, text, decoding)
    return store.worker.run(summarize, served.model, served.tokenizer, read, **kw).text


def load_file(path: str | None) -> str:
    """Handler: an uploaded .txt/.md file's text into the text box."""
    return read_text_file(path)


def started() -> tuple:
    """(summary, stats, Summarize, Stop) as a request starts: the previous summary goes at once,
    so a request that fails or is stopped never sits under the last one's answer."""
    return "", "", *busy()


def stopped_note(summary: str | None) -> str:
    """The stats line after Stop: what is in the box is unfinished, and says so."""
    if summary and summary.strip():
        return "**Stopped:** the summary above is unfinished (what the model had written when you pressed Stop)."
    return "**Stopped** before the model wrote anything."


@dataclass
class SummarizeTab:
    text: gr.Textbox
    summary: gr.Textbox
    stats: gr.Markdown
    button: gr.Button
    stop: gr.Button
    controls: DecodingControls
    last: gr.State  # what the Attention tab shows: the latest finished summary and its input


def build(store: CheckpointStore, concurrency: int | None = 2) -> SummarizeTab:
    """Lay out the tab inside the current gr.Tab and wire its events."""
    with gr.Row(equal_height=False):
        with gr.Column(scale=3):
            text = gr.Textbox(
                label="Article", lines=10, max_lines=20, elem_id="article",
                placeholder="Paste a news article here, upload a .txt or .md file, or pick an example below.",
            )
            upload = gr.File(label="…or upload a .txt / .md file", file_types=[".txt", ".md"], height=130)
            controls = build_decoding_controls(SUMMARIZE_DEFAULTS)
            with gr.Row():
                clear = gr.Button("Clear", variant="secondary", scale=1)
                button = gr.Button("Summarize", variant="primary", scale=3, elem_id="summarize-btn")
                stop = gr.Button("Stop", variant="stop", scale=1, interactive=False, elem_id="summarize-stop")
        with gr.Column(scale=2):
            summary = gr.Textbox(label="Summary", lines=8, max_lines=20, interactive=False, buttons=["copy"], elem_id="summary")
            stats = gr.Markdown(elem_id="summary-stats")
            gr.Markdown(
                "The summary grows as it is generated (for beam search: the best beam so far). "
                "Open the **Attention** tab to see what the model looked at."
            )
    examples = load_examples()
    if examples:
        gr.Examples(
            [[e["article"]] for e in examples], inputs=[text], label="Examples: CNN/DailyMail articles",
            example_labels=[example_label(e["article"]) for e in examples],
        )
    last = gr.State(None)

    stop_flag = gr.State(StopFlag())

    @ui_errors("summarizing")
    def on_summarize(flag, text, *decoding):
        yield from summarize_stream(store, text, *decoding, stop=flag)

    @ui_errors("reading the file")
    def on_upload(path):
        # A refused file is a toast, not an error state: the text box stays usable and the
        # upload widget is emptied for the next try.
        try:
            return load_file(path), None
        except BadInput as e:
            gr.Warning(str(e), title="File not loaded")
            return gr.skip(), None

    wire_stoppable(
        button, stop, stop_flag, started, [summary, stats],
        dict(fn=on_summarize, inputs=[stop_flag, text, *controls.inputs], outputs=[summary, stats, last],
             concurrency_limit=concurrency, concurrency_id="model", api_visibility="private"),
    )
    upload.upload(on_upload, upload, [text, upload], api_visibility="private", show_progress="hidden")
    clear.click(lambda: ("", None, "", ""), None, [text, upload, summary, stats], queue=False, api_visibility="private")
    return SummarizeTab(text, summary, stats, button, stop, controls, last)


def build_api(store: CheckpointStore, concurrency: int | None = 2) -> None:
    """The named `summarize` endpoint: text and decoding options in, summary text out."""
    d = SUMMARIZE_DEFAULTS

    @ui_errors("summarizing")
    def summarize_api(
        text: str,
        strategy: str = d["strategy"],
        num_beams: int = d["num_beams"],
        length_penalty: float = d["length_penalty"],
        no_repeat_ngram_size: int = d["no_repeat_ngram_size"],
        min_length: int = d["min_length"],
        max_length: int = d["max_length"],
        temperature: float = d["temperature"],
        top_k: int = d["top_k"],
        top_p: float = d["top_p"],
        seed: int = d["seed"],
        repetition_penalty: float = d["repetition_penalty"],
        no_repeat_word: bool = d["no_repeat_word"],
        coverage_penalty: float = d["coverage_penalty"],
        source_spelling: bool = d["source_spelling"],
    ) -> str:
        """Summarize `text`. strategy: beam, greedy or sampling."""
        return summarize_text(
            store, text, strategy, num_beams, length_penalty, no_repeat_ngram_size,
            min_length, max_length, temperature, top_k, top_p, seed, repetition_penalty, no_repeat_word, coverage_penalty,
            source_spelling,
        )

    gr.api(summarize_api, api_name="summarize", concurrency_limit=concurrency, concurrency_id="model")
