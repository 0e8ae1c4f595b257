"""Fixes from a user review of the app: the Attention tab's number boxes redraw as they are
typed and move an out-of-range number into range with one sentence; a new request clears the
last one's results; Summarize and ROUGE have a Stop button that really stops the work and keeps
what it wrote, with no "Error" badge; the copy attention view is labelled as one distribution.
Through the handlers and the Blocks' wiring."""
from __future__ import annotations

import contextlib
import copy
import inspect
import threading
import warnings

import gradio as gr
import pytest
from gradio.state_holder import SessionState

from b2b import B2BConfig, Bert2Bert, Tokenizer, save_checkpoint
from demo import tab_attention, tab_rouge, tab_summarize
from demo.controls import StopFlag
from demo.store import CheckpointStore
from demo.ui import build_app
from demo.validate import EVAL_DEFAULTS, SUMMARIZE_DEFAULTS
from demo.worker import ModelWorker

FAST = dict(SUMMARIZE_DEFAULTS, num_beams=2, min_length=0, max_length=6)
DECODING = [FAST[k] for k in SUMMARIZE_DEFAULTS]
GREEDY = [dict(EVAL_DEFAULTS, min_length=0, max_length=5)[k] for k in EVAL_DEFAULTS]
ARTICLE = "The city council voted on Tuesday to build a new bridge over the river. " * 3
CROSS, COPY = "Cross-attention (summary → source)", "Copy attention (pointer-generator)"


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """A tiny pointer-generator model (2 layers, 4 heads), so copy attention exists."""
    root = tmp_path_factory.mktemp("logs")
    cfg = B2BConfig.preset("tiny", pointer_generator=True)
    save_checkpoint(Bert2Bert(cfg), Tokenizer.default(), str(root / "run" / "checkpoints" / "step_0000001"))
    s = CheckpointStore(str(root), fallback=None, settle_seconds=0.0)
    s.refresh()
    return s


@pytest.fixture(scope="module")
def blocks(store):
    return build_app(store, None)


@pytest.fixture(scope="module")
def last_state(store):
    *_, (_, _, state) = tab_summarize.summarize_stream(store, "word " * 300, *DECODING)
    return state


def component(blocks, elem_id):
    return next(b for b in blocks.blocks.values() if getattr(b, "elem_id", None) == elem_id)


def listeners(blocks, comp, event):
    return [fn for fn in blocks.fns.values() if (comp._id, event) in fn.targets]


def index_of(blocks, fn):
    return next(i for i, f in blocks.fns.items() if f is fn)


# -- 1. Attention: typed numbers redraw at once; out of range is moved into range, said once ---


@pytest.mark.parametrize("elem_id", ["attention-layer", "attention-start", "attention-size"])
def test_typing_in_a_slider_number_box_redraws_without_enter_or_blur(blocks, elem_id):
    # Before: only `release` (blur / end of drag) redrew, with Gradio's own range check.
    slider = component(blocks, elem_id)
    (typing,) = listeners(blocks, slider, "input")
    assert typing.preprocess is False  # raw numbers: the handler, not Gradio, checks the range
    assert typing.trigger_mode == "always_last"
    plot = component(blocks, "attention-plot")
    assert plot in typing.outputs and slider in typing.outputs  # a moved number is written back


def test_a_layer_past_the_last_is_moved_to_it_with_one_sentence(store, last_state):
    maps = tab_attention.get_maps(store, tab_attention.MapsCache(), last_state)
    pos = tab_attention.clamp_position(maps, CROSS, 99, 0, 96, typing=True)
    assert pos.layer == 1 and len(pos.notices) == 1
    assert pos.notices[0] == "This model has 2 layers, numbered 0 to 1: layer 99 does not exist, so layer 1 is shown."
    pos = tab_attention.clamp_position(maps, CROSS, 1, 5000, 999)
    assert (pos.start, pos.size) == (len(maps.source_tokens) - 16, 256) and len(pos.notices) == 2
    assert tab_attention.clamp_position(maps, CROSS, 1, 0, 96).notices == []
    # Mid-typing: an empty box, or "3" on the way to "32" tokens, waits instead of jumping to 16.
    assert tab_attention.clamp_position(maps, CROSS, None, 0, 96, typing=True) is None
    assert tab_attention.clamp_position(maps, CROSS, 1, 0, 3, typing=True) is None
    assert tab_attention.clamp_position(maps, CROSS, 1, 0, 3).size == 16  # once the box is left
    # Copy attention has no layers: a layer number there is no mistake.
    assert tab_attention.clamp_position(maps, COPY, 99, 0, 96).notices == []


def test_the_typing_handler_draws_the_last_layer_and_writes_it_back(blocks, last_state):
    (typing,) = listeners(blocks, component(blocks, "attention-layer"), "input")
    raw = [last_state, CROSS, 99.0, tab_attention.MEAN, "Window of tokens", 0, 96, 0, None]
    with warnings.catch_warnings(record=True) as seen:  # gr.Warning outside a request
        warnings.simplefilter("always")
        figure, _, info, layer, *_, warned_at = typing.fn(*raw)
    assert "layer 1" in figure.layout.title.text and "layer 1" in info
    assert layer["value"] == 1
    assert any("layer 99 does not exist" in str(w.message) for w in seen)
    assert warned_at is not None


def test_fast_typing_gives_one_out_of_range_warning_not_one_per_keystroke(blocks, last_state):
    """Typing "99" sends "9" then "99", both past the last layer: the second is drawn (layer 1)
    without a second toast; a number typed out of range later is said again."""
    (typing,) = listeners(blocks, component(blocks, "attention-layer"), "input")
    raw = [last_state, CROSS, 9.0, tab_attention.MEAN, "Window of tokens", 0, 96, 0]

    def warnings_of(layer, warned_at):
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            out = typing.fn(*raw[:2], layer, *raw[3:], warned_at)
        return [str(w.message) for w in seen if "does not exist" in str(w.message)], out

    said, out = warnings_of(9.0, None)
    assert len(said) == 1
    said, again = warnings_of(99.0, out[-1])
    assert said == [] and again[3]["value"] == 1 and again[-1] == out[-1]  # drawn and written back, not said twice
    said, _ = warnings_of(99.0, out[-1] - tab_attention.WARNING_GAP_SECONDS)
    assert len(said) == 1


# -- 4. Copy attention is labelled as one distribution; layer and head are greyed out -----------


def test_copy_attention_says_it_has_no_layers_or_heads(store, blocks, last_state):
    maps = tab_attention.get_maps(store, tab_attention.MapsCache(), last_state)
    view = tab_attention.render(maps, COPY, 1, "head 2", "window", 0, 64, 1)
    title = view.figure.layout.title.text
    assert title.startswith("Copy attention · one distribution (no layers or heads)")
    assert "layer 1" not in title and "head 2" not in title  # the greyed-out controls' values
    assert "(summary token 1), copy attention," in view.info and "layer 1" not in view.info
    assert "by copy attention" in tab_attention.highlight_label(COPY)
    assert "by cross-attention" in tab_attention.highlight_label(CROSS)

    kind = next(b for b in blocks.blocks.values() if isinstance(b, gr.Radio) and b.label == "Attention")
    (on_kind,) = listeners(blocks, kind, "input")
    out = on_kind.fn(last_state, COPY, 1, tab_attention.MEAN, "Window of tokens", 0, 96, 0, None)
    highlight, layer, head = out[1], out[3], out[4]
    assert "by copy attention" in highlight["label"]
    assert layer["interactive"] is False and head["interactive"] is False
    out = on_kind.fn(last_state, CROSS, 1, tab_attention.MEAN, "Window of tokens", 0, 96, 0, None)
    assert out[3]["interactive"] is True and out[4]["interactive"] is True


# -- 2. A new request clears the last one's results --------------------------------------------


def _start_and_work(blocks, button):
    """The button's quick first step (queue=False) and the queued work that follows it."""
    (start,) = listeners(blocks, button, "click")
    (work,) = [fn for fn in blocks.fns.values() if fn.trigger_after == index_of(blocks, start)]
    return start, work


def test_summarize_clears_the_last_summary_before_it_runs(blocks):
    summary, stats = component(blocks, "summary"), component(blocks, "summary-stats")
    start, work = _start_and_work(blocks, component(blocks, "summarize-btn"))
    assert start.queue is False and {summary, stats} <= set(start.outputs)
    values = dict(zip(start.outputs, start.fn(StopFlag())))
    assert values[summary] == "" and values[stats] == ""
    assert summary in work.outputs and work.types_generator


def test_rouge_clears_the_last_scores_before_it_runs(blocks):
    results = [component(blocks, "rouge-summary"), component(blocks, "rouge-table")]
    start, work = _start_and_work(blocks, component(blocks, "rouge-btn"))
    assert start.queue is False and set(results) <= set(start.outputs)
    values = dict(zip(start.outputs, start.fn(StopFlag())))
    assert values[results[0]] == "" and values[results[1]].empty  # headers, no rows


# -- 3. Stop -----------------------------------------------------------------------------------


@pytest.mark.parametrize("button_id, stop_id", [("summarize-btn", "summarize-stop"), ("rouge-btn", "rouge-stop")])
def test_stop_asks_the_work_to_end_and_gives_the_buttons_back(blocks, button_id, stop_id):
    button, stop = component(blocks, button_id), component(blocks, stop_id)
    assert stop.interactive is False  # nothing to stop yet
    start, work = _start_and_work(blocks, button)
    assert work.types_generator  # it checks the flag between two steps
    # Not Gradio's cancel, which showed an "Error" badge over what the work had written: Stop
    # sets the flag the work reads, and the work ends itself with its final outputs.
    (on_stop,) = listeners(blocks, stop, "click")
    assert on_stop.cancels == [] and on_stop.queue is False
    (flag,) = on_stop.inputs
    assert isinstance(flag, gr.State) and start.inputs == [flag] and flag in work.inputs
    assert on_stop.outputs == [stop]  # the results are the work's to write
    value = StopFlag()
    assert on_stop.fn(value)["interactive"] is False and value.is_set()
    start.fn(value)  # the next run starts unstopped
    assert not value.is_set()
    # The buttons come back whichever way the work ends (Gradio 6.31 runs `.then` after
    # success only, `.failure` after an error).
    after = [fn for fn in blocks.fns.values() if fn.trigger_after == index_of(blocks, work)]
    assert {fn.trigger_only_on_failure for fn in after} == {False, True}
    assert all({button, stop} <= set(fn.outputs) for fn in after)


@pytest.mark.parametrize("stop_id", ["summarize-stop", "rouge-stop"])
def test_one_users_stop_does_not_stop_another_users_run(blocks, stop_id):
    (on_stop,) = listeners(blocks, component(blocks, stop_id), "click")
    (flag,) = on_stop.inputs
    mine, theirs = SessionState(blocks)[flag._id], SessionState(blocks)[flag._id]  # two sessions
    assert isinstance(mine, StopFlag) and mine is not theirs
    on_stop.fn(mine)
    assert mine.is_set() and not theirs.is_set()
    assert not copy.deepcopy(mine).is_set()


def test_stopped_summary_and_rouge_say_so():
    note = tab_summarize.stopped_note("The council voted to")
    assert "Stopped" in note and "unfinished" in note
    assert "before the model wrote anything" in tab_summarize.stopped_note("")
    summary, _, table, csv_path = tab_rouge.stopped()
    assert "Stopped" in summary and "no scores" in summary and csv_path is None
    assert table.empty and list(table.columns)[:3] == ["article (start)", "reference", "generated"]


def test_a_stopped_summary_keeps_what_the_search_wrote(store):
    long = [dict(FAST, min_length=40, max_length=60)[k] for k in SUMMARIZE_DEFAULTS]
    stop = threading.Event()
    stream = tab_summarize.summarize_stream(store, ARTICLE, *long, stop=stop)
    assert next(stream)[1] == "Generating…"
    assert next(stream)[1].startswith("Generating… ")  # the first tokens
    stop.set()  # pressed while the search runs
    (summary, stats, state), *rest = list(stream)  # after the step in progress
    assert rest == [] and summary.strip() and "unfinished" in stats
    assert state == gr.skip()  # the Attention tab keeps following finished summaries


def test_a_closed_summary_stream_frees_the_worker_for_the_next(tmp_path, store):
    threaded = CheckpointStore(store.watch_root, fallback=None, settle_seconds=0.0, worker=ModelWorker())
    try:
        threaded.refresh()
        long = [dict(FAST, min_length=40, max_length=60)[k] for k in SUMMARIZE_DEFAULTS]
        stream = tab_summarize.summarize_stream(threaded, ARTICLE, *long)
        next(stream)
        stream.close()  # what Gradio does on Stop
        *_, (summary, stats, state) = tab_summarize.summarize_stream(threaded, ARTICLE, *DECODING)
        assert state["summary"] == summary or summary.startswith("(")
    finally:
        threaded.worker.close()


def test_a_stopped_evaluation_ends_after_the_batch_in_progress(store):
    stop = threading.Event()
    stop.set()
    seen = []
    with pytest.raises(tab_rouge.EvalStopped, match="Stopped after 1 of 4"):
        list(tab_rouge.eval_steps(
            store, tab_rouge.SAMPLE, None, "article", "highlights", 4, 1, GREEDY,
            progress=lambda p, **kw: seen.append(p), stop=stop,
        ))
    assert seen == [(0, 4)]  # no progress past the first batch


@contextlib.contextmanager
def busy_worker(store):
    """A store whose model worker is busy until the block ends, so that what the block queues
    waits; after it, the worker must be free for the next request."""
    worker = ModelWorker()
    threaded = CheckpointStore(store.watch_root, fallback=None, settle_seconds=0.0, worker=worker)
    gate = threading.Event()
    try:
        threaded.refresh()
        busy = worker.submit(gate.wait, 10)
        yield threaded
        gate.set()
        busy.result(timeout=10)
        assert worker.submit(lambda: "free", background=True).result(timeout=10) == "free"
    finally:
        gate.set()
        worker.close()


def test_closing_the_evaluation_stops_it_and_frees_the_worker(store):
    """Closing the steps (Stop, or a page that went away): the queued evaluation is dropped
    and the worker serves the next request rather than minutes of unwanted batches."""
    with busy_worker(store) as threaded:
        stop = threading.Event()
        steps = tab_rouge.eval_steps(threaded, tab_rouge.SAMPLE, None, "article", "highlights", 50, 1, GREEDY, stop=stop)
        assert next(steps) == (0, 50)
        steps.close()
        assert stop.is_set()


def test_a_stopped_evaluation_says_so_and_frees_the_worker(store):
    """The handler shows the stopped outputs at its next look at the flag (within POLL_SECONDS)
    and drops the evaluation, without waiting for the batch in progress."""
    with busy_worker(store) as threaded:
        stop = StopFlag()
        stream = tab_rouge.evaluate_stream(threaded, stop, tab_rouge.SAMPLE, None, "article", "highlights", 50, 1, GREEDY)
        assert next(stream)[0] == "Summarizing… 0 of 50 articles done."
        stop.set()
        (summary, _, table, csv_path), *rest = list(stream)
        assert rest == [] and summary == tab_rouge.STOPPED and table.empty and csv_path is None


def test_the_rouge_handler_is_a_generator_so_stop_can_close_it(blocks):
    _, work = _start_and_work(blocks, component(blocks, "rouge-btn"))
    assert inspect.isgeneratorfunction(work.fn)
