"""Attention tab: encoder, decoder or cross-attention of the latest summary as heatmaps, and
the source words one summary token attended to as highlighted text.

At 512 source tokens a full map is 262k cells per head: the heatmaps show a window of source
tokens (or pool them into spans), so the page stays light; the highlight covers the whole
source (one number per word)."""
from __future__ import annotations

import hashlib
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass

import gradio as gr
import numpy as np

from b2b import AttentionMaps, Bert2Bert, Tokenizer, attention_maps

from .errors import ui_errors
from .figures import STANDS_OUT, attention_heatmap, empty_figure, head_grid, highlight_source, token_axis, top_words
from .store import CheckpointStore
from .validate import BadInput

KINDS = {
    "Cross-attention (summary → source)": "cross",
    "Encoder self-attention (source → source)": "encoder",
    "Decoder self-attention (summary → summary)": "decoder",
    "Copy attention (pointer-generator)": "copy",
}
NO_POINTER = ("This model has no pointer-generator, so nothing is copied: choose another attention "
              "(a model fine-tuned with --pointer-generator has one).")
MEAN, GRID = "mean over heads", "all heads (grid)"
MODES = {"Window of tokens": "window", "Pool into spans": "aggregate"}
GRID_LIMIT = 48  # rows/columns per small heatmap in the grid of heads
SIZE_MIN, SIZE_MAX = 16, 256  # "Source tokens shown"
# Typing "99" into a box sends "9" and then "99": both out of range, one warning is enough.
WARNING_GAP_SECONDS = 2.0
WINDOW_TAIL = 16  # the window may start no later than this many tokens before the source's end
SUMMARY_LIMIT = 256  # summary tokens shown one per row before they are pooled
PLACEHOLDER = "Summarize a text on the Summarize tab: its attention shows here."


class MapsCache:
    """The attention maps of the last few (model, text, summary) triples, so moving a
    slider does not rerun the model. One per app, not a module global."""

    def __init__(self, size: int = 3) -> None:
        self.size = size
        self._items: OrderedDict[tuple, AttentionMaps] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: tuple) -> AttentionMaps | None:
        with self._lock:
            if key in self._items:
                self._items.move_to_end(key)
                return self._items[key]
            return None

    def put(self, key: tuple, maps: AttentionMaps) -> None:
        with self._lock:
            self._items[key] = maps
            while len(self._items) > self.size:
                self._items.popitem(last=False)


def _compute(model: Bert2Bert, tokenizer: Tokenizer, text: str, summary_ids: list[int], ended: bool) -> AttentionMaps:
    """Runs on the model worker: one teacher-forced pass with explicit attention."""
    enc = tokenizer.encode(text, max_length=model.source_limit)
    return attention_maps(model, tokenizer, enc.ids, summary_ids, ended)


def get_maps(store: CheckpointStore, cache: MapsCache, last: dict | None) -> AttentionMaps:
    """Maps for the latest summary, computed with the model that wrote it (cached). If the
    store has swapped in another checkpoint since, BadInput asks for a new summary: the
    attention of other weights would not explain this summary."""
    if not last:
        raise BadInput(PLACEHOLDER)
    digest = hashlib.sha1(last["text"].encode("utf-8", "replace")).hexdigest()
    key = (last.get("model"), digest, tuple(last["summary_ids"]), last["ended"])
    maps = cache.get(key)
    if maps is None:
        served = store.require()
        if served.identity != last.get("model"):
            raise BadInput(
                f"This summary was written by {last.get('headline', 'an earlier model')}, but the app now serves "
                f"{served.headline()}: summarize again to see the attention of the model that is served."
            )
        maps = store.worker.run(_compute, served.model, served.tokenizer, last["text"], last["summary_ids"], last["ended"])
        cache.put(key, maps)
    return maps


def token_choices(maps: AttentionMaps) -> list[tuple[str, int]]:
    return [(f"{i}: {t}", i) for i, t in enumerate(maps.summary_tokens)]


def head_choices(num_heads: int) -> list[str]:
    return [MEAN, GRID] + [f"head {h}" for h in range(num_heads)]


def highlight_label(kind: str) -> str:
    """The highlighted source's label: it names the attention the highlight comes from."""
    by = "copy attention" if KINDS.get(kind, kind) == "copy" else "cross-attention"
    return f"Source, highlighted by {by} (words above {STANDS_OUT:g}× an even share; strongest = 1)"


@dataclass
class Position:
    """Layer, window start and window size, each within what the summary's maps allow;
    `notices` says in one sentence each what was out of range and what is shown instead."""
    layer: int
    start: int
    size: int
    notices: list[str]


def _whole(value: object) -> int | None:
    try:
        return int(round(float(value)))
    except (TypeError, ValueError):  # a number box being retyped sends null
        return None


def clamp_position(
    maps: AttentionMaps, kind: str, layer: object, start: object, size: object, typing: bool = False
) -> Position | None:
    """The typed (or dragged) layer/start/size moved into range; None while there is nothing to
    draw yet: a box is empty, or (`typing`) a number is below its minimum, as "3" is on the
    way to "32" tokens shown (it is moved up once the box loses focus).

    Gradio's Slider would refuse an out-of-range number with "Value 99 is greater than maximum
    value 5." only when another control is touched; the handler reads the raw numbers instead
    (preprocess=False), so the map follows what was typed at once and a too-large layer says
    which layers exist."""
    layer_n, start_n, size_n = _whole(layer), _whole(start), _whole(size)
    if layer_n is None or start_n is None or size_n is None:
        return None
    if typing and (layer_n < 0 or start_n < 0 or size_n < SIZE_MIN):
        return None
    notices = []
    layers = maps.cross.shape[0]
    if KINDS.get(kind, kind) != "copy" and not 0 <= layer_n < layers:  # copy attention has no layers
        shown = min(max(layer_n, 0), layers - 1)
        notices.append(f"This model has {layers} layers, numbered 0 to {layers - 1}: layer {layer_n} does not exist, so "
                       f"layer {shown} is shown.")
        layer_n = shown
    last_start = max(1, len(maps.source_tokens) - WINDOW_TAIL)
    if not 0 <= start_n <= last_start:
        shown = min(max(start_n, 0), last_start)
        notices.append(f"The window starts at a source token from 0 to {last_start} (the source has "
                       f"{len(maps.source_tokens)} tokens), so it starts at {shown}.")
        start_n = shown
    if not SIZE_MIN <= size_n <= SIZE_MAX:
        shown = min(max(size_n, SIZE_MIN), SIZE_MAX)
        notices.append(f"Between {SIZE_MIN} and {SIZE_MAX} source tokens can be shown, so {shown} are.")
        size_n = shown
    return Position(layer_n, start_n, size_n, notices)


@dataclass
class View:
    figure: object
    highlight: list
    info: str


def render(
    maps: AttentionMaps, kind: str, layer: int, head: str, mode: str, start: int, size: int, token: int | None
) -> View:
    """Figure, highlighted source and a caption for one choice of map/layer/head/window."""
    kind = KINDS.get(kind, kind)
    mode = MODES.get(mode, mode)
    src, summ = maps.source_tokens, maps.summary_tokens
    if not summ:
        return View(empty_figure("Attention", "The summary is empty: nothing to show."), [], "The summary is empty.")
    if kind == "copy" and maps.copy is None:
        raise BadInput(NO_POINTER)
    weights = {"encoder": maps.encoder, "decoder": maps.decoder, "cross": maps.cross, "copy": maps.copy}[kind]  # (L, H, Q, K)
    layers, heads = weights.shape[0], weights.shape[1]
    layer = int(min(max(0, int(layer or 0)), layers - 1))
    grid = head == GRID and kind != "copy"
    if kind == "copy":  # one attention, whatever layer and head are chosen
        label, per_head = "one distribution (no layers or heads)", 0
    elif head in (MEAN, GRID) or not head:
        label = MEAN if not grid else GRID
        per_head = None
    else:
        h = int(str(head).split()[-1])
        if not 0 <= h < heads:
            raise BadInput(f"This model has {heads} heads per layer; head {h} does not exist.")
        label, per_head = f"head {h}", h
    limit = min(int(size), GRID_LIMIT) if grid else int(size)
    # Summaries are short: all their tokens show (pooled only past SUMMARY_LIMIT).
    summary_limit = GRID_LIMIT if grid else SUMMARY_LIMIT
    decoder_inputs = ["[CLS]"] + summ[:-1]
    if kind == "encoder":
        rows = cols = token_axis(src, limit, mode, start, "source tokens")
        y_title, x_title = "source token (query)", "source token (key)"
    elif kind == "decoder":
        rows = token_axis(summ, summary_limit, "aggregate", 0, "summary tokens")
        cols = token_axis(decoder_inputs, summary_limit, "aggregate", 0, "summary tokens")
        y_title, x_title = "summary token being generated", "earlier summary token"
    else:
        rows = token_axis(summ, summary_limit, "aggregate", 0, "summary tokens")
        cols = token_axis(src, limit, mode, start, "source tokens")
        y_title, x_title = "summary token being generated", "source token"
    name = {"encoder": "Encoder self-attention", "decoder": "Decoder self-attention", "cross": "Cross-attention",
            "copy": "Copy attention"}[kind]
    title = f"{name} · {label}" if kind == "copy" else f"{name} · layer {layer} · {label}"
    notes = list(dict.fromkeys(n for n in (rows.note, cols.note) if n))
    if notes:
        title += f" · {'; '.join(notes)}"
    layer_w = weights[layer].astype(np.float32)  # (H, Q, K)
    if grid:
        fig = head_grid(layer_w, rows, cols, title, x_title, y_title)
    else:
        w = layer_w.mean(axis=0) if per_head is None else layer_w[per_head]
        fig = attention_heatmap(w, rows, cols, title, x_title, y_title)

    # The highlight: cross-attention (the copy attention, when that is shown) of one summary
    # token over the whole source.
    t = int(min(max(0, int(token or 0)), len(summ) - 1))
    cross = (maps.copy[0] if kind == "copy" else maps.cross[layer]).astype(np.float32)
    row = cross[:, t].mean(axis=0) if per_head is None else cross[per_head, t]
    pieces = highlight_source(src, row)
    best = ", ".join(f"{w} ({s:.2f})" for w, s in top_words(pieces))
    even = 1 / len(src)
    focus = (
        f"attended most to: {best}" if best else
        f"no source word gets {STANDS_OUT:g}× an even share: this attention is spread almost uniformly"
    )
    where = "copy attention" if kind == "copy" else f"layer {layer}, {label if not grid else MEAN}"
    info = (
        f"Generating **{summ[t]}** (summary token {t}), {where}, {focus}. "
        f"Strongest weight {float(row.max()):.4f}; spread evenly it would be {even:.4f}. "
        f"Source: {len(src)} tokens, summary: {len(summ)} tokens."
    )
    if maps.copy_share is not None:
        info += (f" The pointer-generator took {float(maps.copy_share[t]):.0%} of this step's distribution from "
                 "copying source tokens (the rest from the vocabulary).")
    return View(fig, pieces, info)


def build(store: CheckpointStore, last: gr.State, concurrency: int | None = 2) -> None:
    """Lay out the tab; `last` is the Summarize tab's state of the latest finished summary."""
    cache = MapsCache()
    gr.Markdown(
        "Attention of the model that is served, for the text and summary on the **Summarize** tab. "
        "Rows are the tokens asking (for the decoder: the summary token being generated), columns "
        "the tokens attended to; hover a cell for the pair and the weight. Long sources show a "
        "window of tokens (move it with the slider) or are pooled into spans."
    )
    with gr.Row():
        kind = gr.Radio(list(KINDS), value=next(iter(KINDS)), label="Attention", scale=3)
        layer = gr.Slider(0, 1, value=0, step=1, label="Layer", scale=1, elem_id="attention-layer")
        head = gr.Dropdown(head_choices(1), value=MEAN, label="Head", scale=1, elem_id="attention-head")
    with gr.Row():
        mode = gr.Radio(list(MODES), value=next(iter(MODES)), label="Long inputs", scale=2)
        size = gr.Slider(SIZE_MIN, SIZE_MAX, value=96, step=16, label="Source tokens shown", scale=1, elem_id="attention-size")
        start = gr.Slider(0, 512, value=0, step=1, label="Window starts at source token", scale=2, elem_id="attention-start")
    plot = gr.Plot(label="Attention map", elem_id="attention-plot")
    token = gr.Dropdown([], label="Summary token: which source words did it attend to?", elem_id="summary-token")
    info = gr.Markdown(PLACEHOLDER)
    highlight = gr.HighlightedText(
        label=highlight_label(next(iter(KINDS))), show_legend=False, combine_adjacent=False, elem_id="attention-highlight",
    )
    controls = [kind, layer, head, mode, start, size, token]

    def per_kind(kind_v, layers: int) -> tuple[dict, dict]:
        """gr.update arguments of the layer and head controls: greyed out for copy attention,
        which has neither."""
        copy = KINDS.get(kind_v, kind_v) == "copy"
        return dict(interactive=layers > 1 and not copy), dict(interactive=not copy)

    @ui_errors("drawing the attention maps")
    def on_new_summary(last_value, kind_v, mode_v, size_v):
        if not last_value:
            return (gr.skip(),) * 4 + (empty_figure("Attention", PLACEHOLDER), None, PLACEHOLDER)
        maps = get_maps(store, cache, last_value)
        layers, heads = maps.cross.shape[0], maps.cross.shape[1]
        top_layer = layers - 1
        src_len = len(maps.source_tokens)
        size_v = min(max(_whole(size_v) or SIZE_MIN, SIZE_MIN), SIZE_MAX)  # raw: the box may be mid-edit
        view = render(maps, kind_v, top_layer, MEAN, mode_v, 0, size_v, 0)
        layer_ui, head_ui = per_kind(kind_v, layers)
        return (
            gr.update(maximum=max(top_layer, 1), value=top_layer, **layer_ui),
            gr.update(choices=head_choices(heads), value=MEAN, **head_ui),
            gr.update(choices=token_choices(maps), value=0),
            gr.update(maximum=max(1, src_len - WINDOW_TAIL), value=0),
            view.figure, gr.update(value=view.highlight, label=highlight_label(kind_v)), view.info,
        )

    def redraw(last_value, kind_v, layer_v, head_v, mode_v, start_v, size_v, token_v, warned_at, typing=False):
        """Raw values in (preprocess=False): a number typed out of range is moved into range
        here, with a notice, instead of Gradio refusing it later. `warned_at`: when this browser
        session last got such a notice (one per WARNING_GAP_SECONDS), returned updated."""
        if not last_value:
            return (empty_figure("Attention", PLACEHOLDER), None, PLACEHOLDER) + (gr.skip(),) * 5
        maps = get_maps(store, cache, last_value)
        pos = clamp_position(maps, kind_v, layer_v, start_v, size_v, typing)
        if pos is None:  # a box is empty or below its minimum mid-typing: keep the map until it settles
            return (gr.skip(),) * 8
        if pos.notices and (warned_at is None or time.monotonic() - float(warned_at) >= WARNING_GAP_SECONDS):
            for notice in pos.notices:
                gr.Warning(notice, title="Out of range")
            warned_at = time.monotonic()
        view = render(maps, kind_v, pos.layer, head_v, mode_v, pos.start, pos.size, token_v)
        layer_ui, head_ui = per_kind(kind_v, maps.cross.shape[0])
        # A number moved into range is written back, so the box shows the layer that is drawn.
        if float(layer_v) != pos.layer and KINDS.get(kind_v, kind_v) != "copy":
            layer_ui["value"] = pos.layer
        return (
            view.figure, gr.update(value=view.highlight, label=highlight_label(kind_v)), view.info,
            gr.update(**layer_ui), gr.update(**head_ui),
            gr.update(value=pos.start) if float(start_v) != pos.start else gr.skip(),
            gr.update(value=pos.size) if float(size_v) != pos.size else gr.skip(),
            warned_at,
        )

    @ui_errors("drawing the attention maps")
    def on_typing(*values):
        return redraw(*values, typing=True)

    @ui_errors("drawing the attention maps")
    def on_change(*values):
        return redraw(*values)

    common = dict(concurrency_limit=concurrency, concurrency_id="model", api_visibility="private", show_progress="minimal")
    last.change(
        on_new_summary, [last, kind, mode, size], [layer, head, token, start, plot, highlight, info], preprocess=False, **common
    )
    warned = gr.State(None)  # when this session last got an out-of-range notice (time.monotonic)
    inputs, outputs = [last, *controls, warned], [plot, highlight, info, layer, head, start, size, warned]
    raw = dict(trigger_mode="always_last", preprocess=False, **common)
    for c in (kind, head, mode, token):
        c.input(on_change, inputs, outputs, **raw)
    # A Gradio 6 slider has no `submit`: its number box sends `input` at every keystroke (and
    # the track while dragging), so the map follows what is typed, Enter or not; `release`
    # (blur, end of a drag) settles a number left below its minimum.
    for c in (layer, start, size):
        c.input(on_typing, inputs, outputs, **raw)
        c.release(on_change, inputs, outputs, **raw)
