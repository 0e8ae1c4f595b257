"""Decoding controls shared by the Summarize and ROUGE tabs."""
from __future__ import annotations

import threading
from dataclasses import dataclass

import gradio as gr

from .validate import DECODING_FIELDS, EVAL_DEFAULTS, MAX_BEAMS, MAX_NEW_TOKENS, SUMMARIZE_DEFAULTS, decoding_kwargs

# Pixels a knob needs beside its number box before its label wraps ("No-repeat n-gram size"
# went to four lines at Gradio's default 160): narrow columns put two knobs a row instead.
# The checkboxes' long help text needs as much, and a row of its own: beside the sliders they
# got what the sliders left (one or two words a line once greedy or sampling hid three).
WIDE = 240

__all__ = [
    "DecodingControls", "EVAL_DEFAULTS", "SUMMARIZE_DEFAULTS", "StopFlag", "build_decoding_controls", "busy", "idle",
    "request_stop", "wire_stoppable",
]


@dataclass
class DecodingControls:
    strategy: gr.Radio
    num_beams: gr.Slider
    length_penalty: gr.Slider
    no_repeat_ngram_size: gr.Slider
    min_length: gr.Number
    max_length: gr.Number
    temperature: gr.Slider
    top_k: gr.Slider
    top_p: gr.Slider
    seed: gr.Number
    repetition_penalty: gr.Slider
    no_repeat_word: gr.Checkbox
    coverage_penalty: gr.Slider
    source_spelling: gr.Checkbox

    @property
    def inputs(self) -> list:
        """The components in `decoding_kwargs` order."""
        return [getattr(self, name) for name in DECODING_FIELDS]

    @staticmethod
    def kwargs(*values) -> dict:
        """Component values (in `inputs` order) -> checked `summarize()` keyword arguments."""
        return decoding_kwargs(*values)


def _visibility(strategy: str) -> list:
    beam, sample = strategy == "beam", strategy == "sampling"
    return [gr.update(visible=beam)] * 3 + [gr.update(visible=sample)] * 4


def build_decoding_controls(defaults: dict, label: str = "Decoding settings", open: bool = False) -> DecodingControls:
    """An accordion of decoding settings; the beam or sampling ones show for their strategy."""
    d = defaults
    with gr.Accordion(label, open=open):
        strategy = gr.Radio(
            ["beam", "greedy", "sampling"], value=d["strategy"], label="Decoding",
            info="Beam search reads best; greedy is fastest; sampling varies from run to run.",
        )
        with gr.Row():
            num_beams = gr.Slider(1, MAX_BEAMS, value=d["num_beams"], step=1, label="Beams", visible=d["strategy"] == "beam", min_width=WIDE)
            length_penalty = gr.Slider(
                0.0, 3.0, value=d["length_penalty"], step=0.1, label="Length penalty",
                info="Above 1 favours longer summaries.", visible=d["strategy"] == "beam", min_width=WIDE,
            )
            coverage = gr.Slider(
                0.0, 5.0, value=d["coverage_penalty"], step=0.25, label="Coverage penalty",
                info="Copying models: charges a beam for going back to source words it has used; 0: off.",
                visible=d["strategy"] == "beam", min_width=WIDE,
            )
            no_repeat = gr.Slider(0, 6, value=d["no_repeat_ngram_size"], step=1, label="No-repeat n-gram size", info="0: off", min_width=WIDE)
            repetition = gr.Slider(
                1.0, 2.0, value=d["repetition_penalty"], step=0.05, label="Repetition penalty",
                info="Above 1 makes words already written less likely; 1: off.", min_width=WIDE,
            )
        with gr.Row():
            stutter = gr.Checkbox(
                value=d["no_repeat_word"], label="Block word stutter",
                info='A word or short phrase may not follow itself, directly or after ",", "and", "or" '
                'or "of" ("texas, texas", "new york and new york", "the video of the video"), nor a pair '
                'of content words come twice in a sentence ("police say ... police say").', min_width=WIDE,
            )
            spelling = gr.Checkbox(
                value=d["source_spelling"], label="Spell words as the source does",
                info='A word written in several pieces must be a word of the article, or one with -s, -ed, '
                '-ing...: no "albert maysled" for "albert maysles", no half-written names.', min_width=WIDE,
            )
        with gr.Row():
            # No minimum/maximum on these: gradio would refuse an out-of-range value with a vague
            # error; decoding_kwargs checks the range and says it in one sentence.
            min_length = gr.Number(d["min_length"], precision=0, label="Min length (tokens)", info=f"0 to {MAX_NEW_TOKENS}")
            max_length = gr.Number(d["max_length"], precision=0, label="Max length (tokens)", info=f"1 to {MAX_NEW_TOKENS}")
        sampling = d["strategy"] == "sampling"
        with gr.Row():
            temperature = gr.Slider(0.0, 2.0, value=d["temperature"], step=0.05, label="Temperature", visible=sampling, min_width=WIDE)
            top_k = gr.Slider(0, 200, value=d["top_k"], step=1, label="Top-k", info="0: off", visible=sampling, min_width=WIDE)
            top_p = gr.Slider(0.05, 1.0, value=d["top_p"], step=0.05, label="Top-p", info="1: off", visible=sampling, min_width=WIDE)
            seed = gr.Number(value=d["seed"], precision=0, label="Seed", info="-1: random", visible=sampling, min_width=WIDE)
    controls = DecodingControls(
        strategy, num_beams, length_penalty, no_repeat, min_length, max_length, temperature, top_k, top_p, seed, repetition, stutter,
        coverage, spelling,
    )
    strategy.change(
        _visibility, strategy, [num_beams, length_penalty, coverage, temperature, top_k, top_p, seed],
        queue=False, show_progress="hidden", api_visibility="private",
    )
    return controls


QUICK = dict(queue=False, show_progress="hidden", api_visibility="private")  # button swaps: instant, no API


def busy() -> tuple:
    """(run button, Stop) while work runs."""
    return gr.update(interactive=False), gr.update(interactive=True)


def idle() -> tuple:
    """(run button, Stop) once work has ended: done, failed or stopped."""
    return gr.update(interactive=True), gr.update(interactive=False)


class StopFlag(threading.Event):
    """A session's Stop button: the click sets it, the running handler reads it between two
    steps and ends with what it has, the next run clears it. Held in a gr.State, which copies
    its value for each session: the copy is a fresh flag, so one user's Stop never stops
    another user's run."""

    def __deepcopy__(self, memo: dict) -> StopFlag:
        return StopFlag()


def request_stop(flag: StopFlag) -> dict:
    """Stop's click: ask the running work to end after its current step. Stop greys out; the
    run button comes back once the work has ended."""
    flag.set()
    return gr.update(interactive=False)


def wire_stoppable(button: gr.Button, stop: gr.Button, flag: gr.State, started, cleared: list, work: dict):
    """`button` clears `flag` and runs `started()` at once (values for `cleared`, then `busy()`:
    the last results go before new work starts), then the queued `work` (`.then` keyword
    arguments), whose inputs hold `flag`; `stop` sets it, and the work ends itself with its
    final outputs. Not Gradio's `cancels=`: Gradio 6.31's page races the cancelled stream
    and shows an "Error" badge over the outputs, sometimes with a stale update on top.
    The buttons come back however the work ends. Returns the work's event."""

    def start(f: StopFlag) -> tuple:
        f.clear()
        return started()

    event = button.click(start, flag, [*cleared, button, stop], **QUICK).then(**work)
    # Gradio 6.31's page runs `.then` listeners after success only, `.failure` ones after an
    # error: both, so the buttons come back whichever way the work ends.
    event.then(idle, None, [button, stop], **QUICK)
    event.failure(idle, None, [button, stop], **QUICK)
    stop.click(request_stop, flag, stop, **QUICK)
    return event
