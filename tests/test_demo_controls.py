"""The decoding controls (demo/controls.py): out-of-range numbers reach decoding_kwargs, which
answers with one sentence, instead of Gradio's own bound check."""
from __future__ import annotations

import gradio as gr
import pytest

from demo.controls import SUMMARIZE_DEFAULTS, build_decoding_controls
from demo.errors import ui_errors


@pytest.fixture(scope="module")
def controls():
    with gr.Blocks():
        return build_decoding_controls(SUMMARIZE_DEFAULTS)


@pytest.mark.parametrize("name, value, message", [("max_length", 100_000, "Max length must be between 1 and 512"),
                                                  ("min_length", -3, "Min length must be between 0 and 512")])
def test_out_of_range_lengths_get_one_sentence(controls, name, value, message):
    sent = getattr(controls, name).preprocess(value)  # what gradio hands the handler
    assert sent == value
    values = [SUMMARIZE_DEFAULTS[k] for k in SUMMARIZE_DEFAULTS]
    values[list(SUMMARIZE_DEFAULTS).index(name)] = sent

    @ui_errors("summarizing")
    def handler(*decoding):
        return controls.kwargs(*decoding)

    with pytest.raises(gr.Error, match=message) as err:
        handler(*values)
    assert "\n" not in err.value.message
