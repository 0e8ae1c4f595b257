"""Plotly figures: attention heatmaps (windowed or pooled for long inputs), the cross-attention
highlight, ROUGE bars and training curves. Pure functions of numpy arrays and lists."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from b2b import glued_words

SPECIAL = {"[CLS]", "[SEP]", "[PAD]"}
COLORSCALE = "Blues"
_HOVER = "<b>%{y}</b> → <b>%{x}</b><br>weight %{z:.3f}<extra></extra>"


# -- long axes: a window of tokens, or contiguous spans pooled into bins ----------------------


@dataclass
class Axis:
    """Which token positions a heatmap axis shows: `spans[i]` = (start, stop) of row/column i."""

    spans: list[tuple[int, int]]
    labels: list[str]
    note: str = ""  # "tokens 128-255 of 512" / "512 tokens pooled into 128 spans"

    @property
    def starts(self) -> np.ndarray:
        return np.array([s for s, _ in self.spans])

    @property
    def sizes(self) -> np.ndarray:
        return np.array([e - s for s, e in self.spans])


def _short(text: str, width: int = 18) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def token_axis(tokens: list[str], limit: int, mode: str = "window", start: int = 0, what: str = "tokens") -> Axis:
    """Positions to show for `tokens` in at most `limit` rows/columns: all of them when they
    fit, else a window from `start`, or (mode "aggregate") `limit` contiguous spans. `what`
    names them in the note ("source tokens 0-95 of 512")."""
    n = len(tokens)
    limit = max(1, int(limit))
    if n <= limit:
        spans, note = [(i, i + 1) for i in range(n)], ""
    elif mode == "aggregate":
        bounds = np.linspace(0, n, limit + 1).round().astype(int)
        spans = [(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:]) if b > a]
        note = f"{n} {what} pooled into {len(spans)} spans"
    else:
        s = int(min(max(0, start), n - limit))
        spans, note = [(i, i + 1) for i in range(s, s + limit)], f"{what} {s}–{s + limit - 1} of {n}"
    labels = []
    for a, b in spans:  # unique labels: a categorical axis would merge two "the"
        if b - a == 1:
            labels.append(f"{a} {tokens[a]}")
        else:
            labels.append(f"{a}–{b - 1} {_short(' '.join(tokens[a:b]))}")
    return Axis(spans, labels, note)


def reduce(weights: np.ndarray, rows: Axis, cols: Axis) -> np.ndarray:
    """(Q, K) weights -> (len(rows), len(cols)): a row span is the mean of its queries (still
    a distribution), a column span the sum over its keys (the attention mass it received)."""
    w = np.asarray(weights, dtype=np.float32)
    r0, r1 = rows.spans[0][0], rows.spans[-1][1]
    c0, c1 = cols.spans[0][0], cols.spans[-1][1]
    w = w[r0:r1, c0:c1]
    w = np.add.reduceat(w, rows.starts - r0, axis=0) / rows.sizes[:, None]
    return np.add.reduceat(w, cols.starts - c0, axis=1)


# -- heatmaps ---------------------------------------------------------------------------------


def _layout(fig: go.Figure, title: str, n_rows: int, x_title: str, y_title: str) -> go.Figure:
    fig.update_layout(
        title=dict(text=title, x=0.01, font=dict(size=14)),
        height=int(min(900, max(360, 140 + 11 * n_rows))),
        margin=dict(l=10, r=10, t=50, b=10),
        xaxis=dict(title=x_title, type="category", tickangle=-60, tickfont=dict(size=9), automargin=True),
        yaxis=dict(title=y_title, type="category", autorange="reversed", tickfont=dict(size=9), automargin=True),
        plot_bgcolor="white",
    )
    return fig


def attention_heatmap(
    weights: np.ndarray, rows: Axis, cols: Axis, title: str, x_title: str = "key", y_title: str = "query"
) -> go.Figure:
    """One (Q, K) attention map, reduced to the axes, tokens on both axes; hover shows the pair
    and the weight."""
    z = reduce(weights, rows, cols).astype(np.float32)  # plotly sends it as binary float32
    flat = z.size and float(z.max() - z.min()) < 1e-6  # perfectly uniform: 0..max, not -0.5..0.5
    fig = go.Figure(
        go.Heatmap(
            z=z, x=cols.labels, y=rows.labels, colorscale=COLORSCALE, hovertemplate=_HOVER,
            colorbar=dict(title="weight", thickness=12),
            **(dict(zmin=0.0, zmax=float(z.max()) or 1.0) if flat else {}),
        )
    )
    return _layout(fig, title, len(rows.labels), x_title, y_title)


def head_grid(
    weights: np.ndarray, rows: Axis, cols: Axis, title: str, x_title: str = "key", y_title: str = "query"
) -> go.Figure:
    """All heads of one layer, (H, Q, K), as small heatmaps sharing one colour scale."""
    heads = weights.shape[0]
    ncols = min(4, heads)
    nrows = math.ceil(heads / ncols)
    fig = make_subplots(
        rows=nrows, cols=ncols, subplot_titles=[f"head {h}" for h in range(heads)],
        horizontal_spacing=0.015, vertical_spacing=0.04 if nrows > 1 else 0.1,
    )
    zmin, zmax = np.inf, 0.0
    for h in range(heads):
        z = reduce(weights[h], rows, cols).astype(np.float32)
        zmin, zmax = min(zmin, float(z.min())), max(zmax, float(z.max()))
        fig.add_trace(
            go.Heatmap(z=z, x=cols.labels, y=rows.labels, coloraxis="coloraxis", hovertemplate=f"head {h}<br>" + _HOVER),
            row=h // ncols + 1, col=h % ncols + 1,
        )
    fig.update_xaxes(type="category", showticklabels=False)
    fig.update_yaxes(type="category", showticklabels=False, autorange="reversed")
    fig.update_layout(
        title=dict(text=f"{title} — hover for {y_title} → {x_title}", x=0.01, font=dict(size=14)),
        coloraxis=dict(
            colorscale=COLORSCALE, cmin=zmin if zmax - zmin > 1e-6 else 0.0, cmax=zmax or 1.0,
            colorbar=dict(title="weight", thickness=12),
        ),
        height=int(min(1400, 60 + 230 * nrows)), margin=dict(l=10, r=10, t=60, b=10), plot_bgcolor="white",
    )
    return fig


# -- cross-attention as highlighted source text -----------------------------------------------


STANDS_OUT = 1.5  # a word is highlighted when it gets this many times an even share of attention


def highlight_source(
    tokens: list[str], weights: np.ndarray, floor: float = 0.08, stands_out: float = STANDS_OUT
) -> list[tuple[str, float | None]]:
    """Source WordPieces joined into words, each with the weight of its most attended piece
    (a sum would favour words split into many pieces), scaled so the strongest word is 1.
    Words left plain: under `floor`, or under `stands_out` times an even share (1 / tokens),
    so near-uniform attention highlights nothing instead of everything.
    The format of `gr.HighlightedText`."""
    words: list[list] = []  # [text, weight]
    for tok, w in zip(tokens, np.asarray(weights, dtype=np.float32)):
        if tok in SPECIAL:
            continue
        if tok.startswith("##") and words:
            words[-1][0] += tok[2:]
            words[-1][1] = max(words[-1][1], float(w))
        else:
            words.append([tok, float(w)])
    top = max((w for _, w in words), default=0.0) or 1.0
    least = stands_out / max(1, len(tokens))
    out: list[tuple[str, float | None]] = []
    # Spaced as the summaries are (`don't`, `"hi"`, `u.s.`), but each word keeps its own score.
    for (text, w), glued in zip(words, glued_words([text for text, _ in words])):
        score = round(w / top, 3)
        out.append((("" if glued else " ") + text, score if score >= floor and w >= least else None))
    return out


def top_words(pieces: list[tuple[str, float | None]], k: int = 5) -> list[tuple[str, float]]:
    scored = [(t.strip(), s) for t, s in pieces if s is not None]
    return sorted(scored, key=lambda ts: -ts[1])[:k]


# -- ROUGE and training -----------------------------------------------------------------------

ROUGE_NAMES = {"rouge1": "ROUGE-1", "rouge2": "ROUGE-2", "rougeLsum": "ROUGE-Lsum"}


def rouge_bars(model: dict[str, float], lead3: dict[str, float], n: int) -> go.Figure:
    """Model and Lead-3, side by side per ROUGE variant (F1 x 100)."""
    names = list(ROUGE_NAMES.values())
    fig = go.Figure()
    for label, scores, color in (("model", model, "#2563eb"), ("Lead-3 baseline", lead3, "#9ca3af")):
        values = [scores[k] for k in ROUGE_NAMES]
        fig.add_bar(name=label, x=names, y=values, marker_color=color, text=[f"{v:.1f}" for v in values], textposition="outside")
    top = max([*model.values(), *lead3.values(), 1.0])
    fig.update_layout(
        title=dict(text=f"ROUGE F1 on {n} article{'' if n == 1 else 's'}", x=0.01), barmode="group", height=360,
        yaxis=dict(title="F1 × 100", range=[0, top * 1.2]), margin=dict(l=10, r=10, t=50, b=10),
        legend=dict(orientation="h", y=1.1, x=1, xanchor="right"), plot_bgcolor="white",
    )
    return fig


def _empty(title: str, message: str, height: int = 320) -> go.Figure:
    fig = go.Figure()
    fig.add_annotation(
        text=message, showarrow=False, x=0.5, y=0.5, xref="paper", yref="paper", font=dict(size=13, color="#6b7280")
    )
    fig.update_layout(
        title=dict(text=title, x=0.01), height=height, xaxis=dict(visible=False), yaxis=dict(visible=False),
        margin=dict(l=10, r=10, t=50, b=10), plot_bgcolor="white",
    )
    return fig


def empty_figure(title: str, message: str) -> go.Figure:
    """A placeholder with a centred message ("no data yet")."""
    return _empty(title, message)


# Plotly picks at most 10 ticks; over fewer steps than that its ticks fall between steps (2.5).
WHOLE_STEPS = 10


def step_ticks(steps: list[int]) -> dict:
    """x-axis settings that keep the ticks on whole steps: one tick per step when the steps
    span fewer than WHOLE_STEPS, Plotly's own choice (whole numbers by then) otherwise."""
    return dict(tick0=0, dtick=1) if max(steps) - min(steps) < WHOLE_STEPS else {}


def curves(
    metrics: dict[str, list[tuple[int, float]]], tags: list[str], title: str, y_title: str, empty: str,
    marker_step: int | None = None,
) -> go.Figure:
    """Line chart of the scalar series `tags` from `read_metrics`; `marker_step` draws the
    served checkpoint's step as a vertical line."""
    present = [t for t in tags if metrics.get(t)]
    if not present:
        return _empty(title, empty)
    fig = go.Figure()
    shown: list[int] = []
    for tag in present:
        steps, values = zip(*metrics[tag])
        shown += steps
        sparse = len(steps) < 30  # evaluations: few points, show them
        fig.add_scatter(x=steps, y=values, name=tag, mode="lines+markers" if sparse else "lines")
    if marker_step is not None:
        shown.append(marker_step)
        # Named in the legend, not by a text over the line: that text sat where the legend is.
        fig.add_vline(x=marker_step, line_dash="dot", line_color="#f97316", name="served", showlegend=True)
    # The legend stands on the plot and grows upwards, under the title (which stays clear of
    # Gradio's label over the plot's corner): in a narrow column its second row goes into the
    # margin, not over the curves.
    fig.update_layout(
        title=dict(text=title, x=0.01, y=1, yref="container", yanchor="top", pad=dict(t=38)), height=390,
        xaxis_title="step", yaxis_title=y_title, margin=dict(l=10, r=10, t=100, b=10),
        legend=dict(orientation="h", y=1.02, yanchor="bottom", x=1, xanchor="right"),
        hovermode="x unified", plot_bgcolor="white",
    )
    fig.update_xaxes(gridcolor="#eee", **step_ticks(shown))
    fig.update_yaxes(gridcolor="#eee")
    return fig
