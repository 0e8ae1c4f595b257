"""Figures: 512-token attention stays small (window or pool), highlights join WordPieces."""
from __future__ import annotations

import numpy as np

from demo.figures import (
    attention_heatmap,
    curves,
    head_grid,
    highlight_source,
    reduce,
    rouge_bars,
    step_ticks,
    token_axis,
    top_words,
)

S = 512


def softmax_rows(rng, shape):
    x = rng.standard_normal(shape).astype(np.float32)
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def test_window_and_pool_keep_a_512_token_map_small_and_exact():
    rng = np.random.default_rng(0)
    tokens = [f"t{i}" for i in range(S)]
    w = softmax_rows(rng, (S, S))

    window = token_axis(tokens, 128, "window", start=500)  # clamped to the end
    assert window.spans[0] == (S - 128, S - 127) and len(window.labels) == 128
    assert window.labels[0] == f"{S - 128} t{S - 128}" and "of 512" in window.note
    z = reduce(w, window, window)
    assert np.allclose(z, w[S - 128 :, S - 128 :])

    pooled = token_axis(tokens, 64, "aggregate")
    assert len(pooled.spans) == 64 and pooled.spans[0][0] == 0 and pooled.spans[-1][1] == S
    z = reduce(w, pooled, pooled)
    assert np.allclose(z.sum(axis=1), 1.0, atol=1e-4)  # pooled rows are still distributions

    fig = attention_heatmap(w, window, window, "enc")
    assert len(fig.to_json()) < 600_000  # a full 512x512 map would be several MB
    assert len(set(window.labels)) == 128  # a categorical axis must not merge repeated tokens


def test_head_grid_has_one_panel_per_head_with_a_shared_scale():
    rng = np.random.default_rng(1)
    tokens = [f"t{i}" for i in range(S)]
    axis = token_axis(tokens, 48, "aggregate")
    fig = head_grid(softmax_rows(rng, (12, S, S)), axis, axis, "grid")
    assert len(fig.data) == 12 and {t.coloraxis for t in fig.data} == {"coloraxis"}


def test_highlight_joins_wordpieces_and_skips_specials():
    tokens = ["[CLS]", "the", "bridge", "##s", "collapsed", ",", "police", "said", "[SEP]"]
    weights = np.array([0.5, 0.01, 0.1, 0.3, 0.05, 0.0, 0.1, 0.04, 0.0])
    pieces = highlight_source(tokens, weights)
    assert [t for t, _ in pieces] == ["the", " bridges", " collapsed", ",", " police", " said"]
    scores = dict((t.strip(), s) for t, s in pieces)
    assert scores["bridges"] == 1.0  # its strongest piece, ##s, is the strongest token
    assert scores["the"] is None  # under the floor: left plain
    assert scores["collapsed"] is None and scores["police"] is None  # under 1.5x an even share (1/9)
    assert top_words(pieces, 2) == [("bridges", 1.0)]
    lenient = dict((t.strip(), s) for t, s in highlight_source(tokens, weights, stands_out=0.5))
    assert lenient["police"] == round(0.1 / 0.3, 3)


def test_highlight_writes_contractions_as_one_word():
    tokens = ["we", "don", "'", "t", "know", "cayman", "'", "s", "father", ",", "they", "'", "re", "sure"]
    pieces = highlight_source(tokens, np.full(len(tokens), 1 / len(tokens)))
    assert "".join(t for t, _ in pieces) == "we don't know cayman's father, they're sure"


def test_highlight_pairs_quotes_as_summaries_do():
    tokens = ["[CLS]", "he", "called", "it", '"', "the", "forgotten", "floor", '"', ".", "[SEP]"]
    weights = np.array([0.0, 0.05, 0.05, 0.05, 0.05, 0.1, 0.4, 0.2, 0.05, 0.05, 0.0])
    pieces = highlight_source(tokens, weights)
    assert "".join(t for t, _ in pieces) == 'he called it "the forgotten floor".'
    assert dict(pieces)[" forgotten"] == 1.0  # each word keeps its own score


def test_uniform_attention_highlights_nothing():
    tokens = ["[CLS]"] + [f"w{i}" for i in range(510)] + ["[SEP]"]
    weights = np.full(512, 1 / 512) + np.random.default_rng(0).normal(0, 1e-7, 512)
    assert all(score is None for _, score in highlight_source(tokens, weights))


def test_rouge_bars_and_curves():
    fig = rouge_bars({"rouge1": 30, "rouge2": 10, "rougeLsum": 28}, {"rouge1": 35, "rouge2": 14, "rougeLsum": 32}, 5)
    assert [t.name for t in fig.data] == ["model", "Lead-3 baseline"]
    metrics = {"train/loss": [(1, 3.0), (2, 2.5)], "val/loss": []}
    fig = curves(metrics, ["train/loss", "val/loss"], "Loss", "ce", "empty", marker_step=2)
    assert [t.name for t in fig.data] == ["train/loss"]
    empty = curves({}, ["val/rouge1"], "ROUGE", "F1", "No ROUGE yet.")
    assert not empty.data and "No ROUGE yet." in empty.to_json()


def test_a_short_run_has_ticks_on_whole_steps_only():
    """Three steps: Plotly alone put ticks at 2.5 and 3.5."""
    metrics = {"val/rouge1": [(3, 0.3)], "val/rouge2": [(3, 0.0)]}
    axis = curves(metrics, ["val/rouge1", "val/rouge2"], "ROUGE", "F1", "empty", marker_step=3).layout.xaxis
    assert (axis.tick0, axis.dtick) == (0, 1)
    assert step_ticks([1000, 1009]) == dict(tick0=0, dtick=1)
    assert step_ticks([0, 10]) == {} and step_ticks(list(range(0, 5000, 50))) == {}  # Plotly's ticks: whole already
    long = curves({"train/loss": [(s, 1.0) for s in range(0, 500, 10)]}, ["train/loss"], "Loss", "ce", "empty")
    assert long.layout.xaxis.dtick is None


def test_the_served_marker_is_named_in_the_legend_not_over_it():
    """Its "served" text sat above the plot, where the legend is."""
    metrics = {"val/rouge1": [(100, 20.0), (200, 25.0)], "val/rouge2": [(100, 8.0), (200, 9.0)]}
    fig = curves(metrics, ["val/rouge1", "val/rouge2"], "ROUGE", "F1", "empty", marker_step=200)
    assert not fig.layout.annotations
    (line,) = fig.layout.shapes
    assert (line.x0, line.x1, line.name, line.showlegend) == (200, 200, "served", True)
    assert fig.layout.legend.yanchor == "bottom" and fig.layout.legend.y > 1  # above the plot, growing upwards
    assert not curves(metrics, ["val/rouge1"], "ROUGE", "F1", "empty").layout.shapes
