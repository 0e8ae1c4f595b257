"""The tabs' handlers, called directly (no browser, no server), on a tiny checkpoint."""
from __future__ import annotations

import csv
import json

import gradio as gr
import numpy as np
import pytest

from b2b import B2BConfig, Bert2Bert, Tokenizer, save_checkpoint
from demo import tab_attention, tab_rouge, tab_summarize, tab_training
from demo.errors import ui_errors
from demo.store import CheckpointStore, NoCheckpoint
from demo.ui import build_app, header_markdown
from demo.validate import CHARS_PER_POSITION, EVAL_DEFAULTS, SUMMARIZE_DEFAULTS, BadInput

FAST = dict(SUMMARIZE_DEFAULTS, num_beams=2, min_length=0, max_length=6)
DECODING = [FAST[k] for k in SUMMARIZE_DEFAULTS]
GREEDY = [dict(EVAL_DEFAULTS, min_length=0, max_length=5)[k] for k in EVAL_DEFAULTS]
ARTICLE = "The city council voted on Tuesday to build a new bridge over the river. " * 3


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("logs")
    run = root / "run1"
    save_checkpoint(
        Bert2Bert(B2BConfig.preset("tiny")), Tokenizer.default(), str(run / "checkpoints" / "step_0000010"),
        extra={"trainer_state.json": {
            "step": 10, "last_eval": {"val/rouge2": 1.5}, "best_metric": 1.5, "best_step": 10, "metric_name": "val/rouge2",
        }},
    )
    with open(run / "metrics.jsonl", "w") as f:
        for step in range(0, 50, 5):
            f.write(json.dumps({"step": step, "tag": "train/loss", "value": 9 - step / 10, "time": 0}) + "\n")
        f.write(json.dumps({"step": 10, "tag": "val/rouge2", "value": 1.5, "time": 0}) + "\n")
        f.write('{"step": 50, "tag": "train/lo')  # a live run's half-written last line
    return root


@pytest.fixture(scope="module")
def store(run_dir):
    s = CheckpointStore(str(run_dir), fallback=None, settle_seconds=0.0)
    s.refresh()
    assert s.current() is not None
    return s


@pytest.fixture
def empty_store(tmp_path):
    return CheckpointStore(str(tmp_path), fallback=None)


# -- Summarize ---------------------------------------------------------------------------------


def test_summary_streams_then_reports_tokens_time_and_speed(store):
    chunks = list(tab_summarize.summarize_stream(store, ARTICLE, *DECODING))
    assert chunks[0][1] == "Generating…"
    summary, stats, state = chunks[-1]
    assert isinstance(summary, str) and summary
    assert "tokens/s" in stats and "Input:" in stats and "Truncated" not in stats
    assert state["text"] == ARTICLE and len(state["summary_ids"]) <= 6
    assert state["checkpoint"] == store.current().path
    assert all(isinstance(c[2], type(gr.skip())) for c in chunks[:-1])  # state only at the end


def test_long_input_shows_the_truncation_notice(store):
    *_, (_, stats, _) = tab_summarize.summarize_stream(store, "word " * 400, *DECODING)
    assert "Truncated" in stats and "first 128" in stats


def test_a_pasted_megabyte_is_cut_before_it_is_tokenized(store, monkeypatch):
    served = store.current()
    seen = []
    cls = type(served.tokenizer)
    encode, encode_plain = cls.encode, cls.encode_plain
    monkeypatch.setattr(cls, "encode", lambda self, t, *a, **k: seen.append(len(t)) or encode(self, t, *a, **k))
    monkeypatch.setattr(cls, "encode_plain", lambda self, ts: seen.extend(map(len, ts)) or encode_plain(self, ts))
    text = "word " * 190_000  # 950 KB: under the 1 MB limit
    *_, (_, stats, state) = tab_summarize.summarize_stream(store, text, *DECODING)
    limit = CHARS_PER_POSITION * served.model.config.max_positions
    assert seen and max(seen) <= limit  # the tokenizer never saw the megabyte
    assert len(state["text"]) <= limit  # and the Attention tab reads the same text
    assert "950,000 characters, cut to the first" in stats and "Truncated" in stats


def test_summarize_api_returns_text(store):
    assert isinstance(tab_summarize.summarize_text(store, ARTICLE, *DECODING), str)


@pytest.mark.parametrize(
    "text, decoding, message",
    [
        ("   ", DECODING, "no text to summarize"),
        ("x" * 1_000_001, DECODING, "1 MB"),
        ("x" * 1_000_001, DECODING, "reads only its first 128 tokens"),  # the served model's size
        (ARTICLE, ["beam", 4, 1.0, 3, 50, 10, 1.0, 50, 0.9, -1], "must not exceed max length"),
        (ARTICLE, ["sampling", 1, 1.0, 3, 0, 10, 1.0, 50, 1.5, -1], "Top-p"),
    ],
)
def test_bad_input_becomes_one_gr_error(store, text, decoding, message):
    @ui_errors("summarizing")
    def handler(t, *d):
        yield from tab_summarize.summarize_stream(store, t, *d)

    with pytest.raises(gr.Error, match=message) as err:
        list(handler(text, *decoding))
    assert "\n" not in err.value.message and "Traceback" not in err.value.message


def test_no_checkpoint_gives_a_sentence_not_a_traceback(empty_store):
    with pytest.raises(NoCheckpoint, match="train.finetune"):
        list(tab_summarize.summarize_stream(empty_store, ARTICLE, *DECODING))
    assert "No checkpoint yet" in header_markdown(empty_store)
    assert "python -m train.finetune" in header_markdown(empty_store)


def test_uploaded_file_fills_the_text_box(tmp_path):
    f = tmp_path / "a.txt"
    f.write_text("Hello world.")
    assert tab_summarize.load_file(str(f)) == "Hello world."
    binary = tmp_path / "b.txt"
    binary.write_bytes(b"\xff\xfe\x00\x00garbage")
    with pytest.raises(BadInput):
        tab_summarize.load_file(str(binary))


def test_unexpected_errors_become_a_generic_sentence():
    @ui_errors("testing")
    def broken():
        raise KeyError("oops")

    with pytest.raises(gr.Error, match="Something went wrong while testing"):
        broken()


# -- Attention ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def last_state(store):
    *_, (_, _, state) = tab_summarize.summarize_stream(store, "word " * 300, *DECODING)
    return state


def test_attention_maps_are_cached_per_summary(store, last_state):
    cache = tab_attention.MapsCache()
    maps = tab_attention.get_maps(store, cache, last_state)
    again = tab_attention.get_maps(store, cache, last_state)
    assert again is maps
    n_src = len(maps.source_tokens)
    assert n_src == 128 and maps.encoder.shape == (2, 4, n_src, n_src)
    assert maps.cross.shape[2] == len(maps.summary_tokens)


@pytest.mark.parametrize("kind", [k for k, v in tab_attention.KINDS.items() if v != "copy"])
@pytest.mark.parametrize("head", [tab_attention.MEAN, tab_attention.GRID, "head 3"])
@pytest.mark.parametrize("mode", list(tab_attention.MODES))
def test_every_view_renders(store, last_state, kind, head, mode):
    maps = tab_attention.get_maps(store, tab_attention.MapsCache(), last_state)
    view = tab_attention.render(maps, kind, 1, head, mode, 40, 32, 1)
    heatmaps = [t for t in view.figure.data if t.type == "heatmap"]
    assert len(heatmaps) == (4 if head == tab_attention.GRID else 1)
    z = np.asarray(heatmaps[0].z)
    assert z.shape[1] <= 32 and z.shape[0] <= 32
    assert "%{y}" in heatmaps[0].hovertemplate and "%{z" in heatmaps[0].hovertemplate
    assert view.highlight and all(isinstance(t, str) for t, _ in view.highlight)
    assert "Strongest weight" in view.info and ("attended most to" in view.info or "almost uniformly" in view.info)


def test_copy_attention_is_one_sentence_without_a_pointer(store, last_state):
    maps = tab_attention.get_maps(store, tab_attention.MapsCache(), last_state)
    with pytest.raises(BadInput, match="no pointer-generator"):
        tab_attention.render(maps, "copy", 0, tab_attention.MEAN, "window", 0, 64, 0)


@pytest.mark.parametrize("head", [tab_attention.MEAN, tab_attention.GRID, "head 3"])
def test_copy_attention_of_a_pointer_model(tmp_path, head):
    cfg = B2BConfig.preset("tiny", pointer_generator=True)
    save_checkpoint(Bert2Bert(cfg), Tokenizer.default(), str(tmp_path / "run" / "checkpoints" / "step_0000001"))
    store = CheckpointStore(str(tmp_path), fallback=None, settle_seconds=0.0)
    store.refresh()
    *_, (_, _, state) = tab_summarize.summarize_stream(store, ARTICLE, *DECODING)
    maps = tab_attention.get_maps(store, tab_attention.MapsCache(), state)
    T, S = len(maps.summary_tokens), len(maps.source_tokens)
    assert maps.copy.shape == (1, 1, T, S) and maps.copy_share.shape == (T,)
    assert ((maps.copy_share > 0) & (maps.copy_share < 1)).all()
    # Weights over copyable source tokens only: [CLS] and [SEP] get none.
    assert float(maps.copy[0, 0, :, 0].max()) == 0.0 and np.allclose(maps.copy[0, 0].astype(np.float32).sum(-1), 1, atol=1e-2)
    view = tab_attention.render(maps, "Copy attention (pointer-generator)", 3, head, "window", 0, 64, 1)
    assert len([t for t in view.figure.data if t.type == "heatmap"]) == 1
    assert "Copy attention" in view.figure.layout.title.text and "from copying source tokens" in view.info


def test_attention_of_an_older_summary_never_uses_a_newer_model(tmp_path):
    def save(step):
        save_checkpoint(Bert2Bert(B2BConfig.preset("tiny")), Tokenizer.default(), str(tmp_path / "run" / "checkpoints" / f"step_{step:07d}"))

    save(1)
    store = CheckpointStore(str(tmp_path), fallback=None, settle_seconds=0.0)
    store.refresh()
    *_, (_, _, old) = tab_summarize.summarize_stream(store, ARTICLE, *DECODING)
    cache = tab_attention.MapsCache()
    maps = tab_attention.get_maps(store, cache, old)
    save(2)  # training writes a newer checkpoint; the store swaps it in
    assert store.refresh() and store.current().step == 2
    assert tab_attention.get_maps(store, cache, old) is maps  # computed with the model that wrote it
    with pytest.raises(BadInput, match="summarize again") as err:
        tab_attention.get_maps(store, tab_attention.MapsCache(), old)  # not cached: refused, not mixed
    assert "step 1" in str(err.value) and "step 2" in str(err.value) and "\n" not in str(err.value)
    *_, (_, _, new) = tab_summarize.summarize_stream(store, ARTICLE, *DECODING)
    assert tab_attention.get_maps(store, cache, new) is not maps


def test_attention_needs_a_summary_first(store):
    with pytest.raises(BadInput, match="Summarize a text"):
        tab_attention.get_maps(store, tab_attention.MapsCache(), None)


def test_a_head_that_does_not_exist_is_one_sentence(store, last_state):
    maps = tab_attention.get_maps(store, tab_attention.MapsCache(), last_state)
    with pytest.raises(BadInput, match="4 heads"):
        tab_attention.render(maps, "cross", 0, "head 9", "window", 0, 64, 0)


# -- ROUGE -------------------------------------------------------------------------------------


def test_rouge_on_the_bundled_sample_with_progress_and_csv(store, tmp_path):
    seen = []
    out = tab_rouge.run_eval(
        store, tab_rouge.SAMPLE, None, "article", "highlights", 3, 2, GREEDY,
        progress=lambda p, **kw: seen.append(p), out_dir=str(tmp_path),
    )
    assert seen[0] == (0, 3) and seen[-1] == (3, 3)
    assert set(out.report.model) == {"rouge1", "rouge2", "rougeLsum"}
    assert out.report.lead3["rouge1"] > 10  # Lead-3 is a real baseline on CNN/DM
    assert len(out.table) == 3 and "ROUGE-Lsum" in out.table.columns
    assert {t.name for t in out.figure.data} == {"model", "Lead-3 baseline"}
    with open(out.csv_path) as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 3 and {"article", "reference", "generated", "rouge1"} <= set(rows[0])
    assert "Lead-3" in out.summary


def test_rouge_on_an_upload_with_other_fields(store, tmp_path):
    data = tmp_path / "pairs.csv"
    data.write_text('story,summary\n"One. Two. Three. Four.","One."\n"Alpha beta. Gamma.","Beta."\n')
    assert tab_rouge.guess_fields(["id", "story", "summary"]) == ("story", "summary")
    out = tab_rouge.run_eval(store, tab_rouge.UPLOAD, str(data), "story", "summary", 5, 8, GREEDY, out_dir=str(tmp_path))
    assert out.report.n == 2


def test_rouge_upload_with_unknown_field_names_is_not_scored(store, tmp_path):
    # Before: the first two columns were taken for article and reference, and scored.
    assert tab_rouge.guess_fields(["id", "body", "gist"]) == (None, None)
    assert tab_rouge.guess_fields(["Text", "notes"]) == ("Text", None)
    data = tmp_path / "pairs.csv"
    data.write_text('id,body,gist\n1,"One. Two. Three. Four.","One."\n')
    with pytest.raises(BadInput) as err:
        tab_rouge.run_eval(store, tab_rouge.UPLOAD, str(data), None, None, 5, 8, GREEDY)
    message = str(err.value)
    assert "its fields are: id, body, gist" in message and "article, document, text" in message
    assert "highlights, summary, reference" in message and "\n" not in message
    # Chosen by hand, the same file is scored.
    assert tab_rouge.run_eval(store, tab_rouge.UPLOAD, str(data), "body", "gist", 5, 8, GREEDY, out_dir=str(tmp_path)).report.n == 1


def test_rouge_upload_without_the_fields_says_which_exist(store, tmp_path):
    data = tmp_path / "pairs.jsonl"
    data.write_text(json.dumps({"text": "a", "abstract": "b"}) + "\n")
    with pytest.raises(ValueError, match="has no field 'article'; its fields are: text, abstract"):
        tab_rouge.run_eval(store, tab_rouge.UPLOAD, str(data), "article", "highlights", 5, 8, GREEDY)
    with pytest.raises(BadInput, match="different fields"):
        tab_rouge.run_eval(store, tab_rouge.UPLOAD, str(data), "text", "text", 5, 8, GREEDY)
    with pytest.raises(BadInput, match="N must be between"):
        tab_rouge.run_eval(store, tab_rouge.SAMPLE, None, "article", "highlights", 0, 8, GREEDY)


# -- Training ----------------------------------------------------------------------------------


def test_training_tab_shows_served_checkpoint_and_live_curves(store, run_dir):
    md, dropdown, loss, rouge, tb, seen = tab_training.refresh(store, str(run_dir), None, None)
    assert "step 10" in md and "rouge2 1.50" in md and "best val/rouge2" in md
    assert dropdown["value"] == str(run_dir / "run1")
    assert [t.name for t in loss.data] == ["train/loss"] and len(loss.data[0].x) == 10
    assert [t.name for t in rouge.data] == ["val/rouge2"]
    assert f"tensorboard --logdir {run_dir}" in tb
    # Nothing changed: the figures are not rebuilt.
    _, _, loss2, rouge2, _, seen2 = tab_training.refresh(store, str(run_dir), None, seen)
    assert seen2 == seen and isinstance(loss2, type(gr.skip()))
    with open(run_dir / "run1" / "metrics.jsonl", "a") as f:
        f.write('\n{"step": 60, "tag": "train/loss", "value": 1.0, "time": 0}\n')
    _, _, loss3, _, _, _ = tab_training.refresh(store, str(run_dir), None, seen)
    assert len(loss3.data[0].x) == 11


def test_training_tab_quotes_the_eval_report_of_an_exported_model(tmp_path):
    shipped = save_checkpoint(Bert2Bert(B2BConfig.preset("tiny")), Tokenizer.default(), str(tmp_path / "shipped"))
    report = {"n": 1000, "model": {"rouge1": 31.6, "rouge2": 11.85, "rougeLsum": 29.01},
              "lead3": {"rouge1": 29.5, "rouge2": 11.26, "rougeLsum": 26.29}, "settings": {"num_beams": 4}}
    (tmp_path / "shipped" / "eval_test_beam4.json").write_text(json.dumps(report))
    store = CheckpointStore(str(tmp_path / "logs"), fallback=shipped, settle_seconds=0.0)
    assert store.refresh()
    md = tab_training.served_markdown(store)
    assert "Validation at that step:** not recorded" in md  # no trainer state beside the weights
    assert "Evaluated:** Measured on 1,000 test articles, beam 4: ROUGE-2 11.8 / ROUGE-Lsum 29.0" in md


def test_training_tab_without_runs(empty_store, tmp_path):
    md, _, loss, _, _, _ = tab_training.refresh(empty_store, str(tmp_path), None, None)
    assert "No checkpoint is served yet" in md
    assert not loss.data  # a placeholder figure


# -- The app -----------------------------------------------------------------------------------


def test_the_app_builds_with_named_api_endpoints(store, run_dir):
    blocks = build_app(store, str(run_dir))
    names = {fn.api_name for fn in blocks.fns.values() if fn.api_visibility != "private"}
    assert {"summarize", "model_info"} <= names


def test_header_quotes_the_test_rouge_a_checkpoint_carries(tmp_path):
    """A checkpoint with train.evaluate reports beside it (as the shipped one has) says in the
    header how good it measured: plain decoding, beam search and the largest sample preferred."""
    folder = tmp_path / "ckpt"
    save_checkpoint(Bert2Bert(B2BConfig.preset("tiny")), Tokenizer.default(), str(folder))
    scores = lambda r2: {"rouge1": 20.0, "rouge2": r2, "rougeLsum": 18.25}  # noqa: E731
    for name, n, beams, r2, penalty in (
        ("eval_test_beam1.json", 1000, 1, 2.85, 1.0), ("eval_test_beam4.json", 1000, 4, 3.19, 1.0),
        ("eval_small_beam4.json", 10, 4, 9.0, 1.0), ("eval_test_beam8_rep.json", 1000, 8, 7.0, 1.3),
    ):
        report = {"n": n, "model": scores(r2), "lead3": {"rouge1": 29.5, "rouge2": 11.26, "rougeLsum": 26.29},
                  "settings": {"num_beams": beams, "repetition_penalty": penalty}}
        (folder / name).write_text(json.dumps(report))
    (folder / "eval_broken.json").write_text("{not json")
    (folder / "MODEL_CARD.md").write_text("# card")
    s = CheckpointStore(str(tmp_path / "nothing"), fallback=str(folder), settle_seconds=0.0)
    s.refresh()
    text = header_markdown(s)
    assert "1,000 test articles, beam 4: ROUGE-2 3.2 / ROUGE-Lsum 18.2 (Lead-3: 11.3 / 26.3)" in text
    assert "MODEL_CARD.md" in text


@pytest.mark.parametrize("recorded", ["decoding.json", "run settings only"])
def test_the_app_reads_the_source_length_the_model_was_trained_on(tmp_path, recorded):
    """A checkpoint trained on 16-token sources is summarized and mapped from 16 tokens, whether
    its decoding.json says so or (a run from before that file) its run's settings.json does."""
    model = Bert2Bert(B2BConfig.preset("tiny"))
    run = tmp_path / "logs" / "run"
    if recorded == "decoding.json":
        model.trained_source_length = 16
    else:
        run.mkdir(parents=True)
        (run / "settings.json").write_text(json.dumps({"max_source_len": 16}))
    save_checkpoint(model, Tokenizer.default(), str(run / "checkpoints" / "step_0000010"),
                    extra={"trainer_state.json": {"task": "summarization", "step": 10}})
    store = CheckpointStore(str(tmp_path / "logs"), fallback=None, settle_seconds=0.0)
    store.refresh()
    assert store.current().model.source_limit == 16

    *_, (_, stats, state) = tab_summarize.summarize_stream(store, ARTICLE, *DECODING)
    assert "Truncated" in stats and "first 16 tokens" in stats
    maps = tab_attention.get_maps(store, tab_attention.MapsCache(), state)
    assert len(maps.source_tokens) == 16 and maps.cross.shape[-1] == 16


def test_no_checkpoint_screen_commands_fit_without_scrolling_and_paste_as_one(empty_store):
    from demo.store import TRAIN_FULL

    text = header_markdown(empty_store)
    block = text.split("```bash\n")[1].split("```")[0]
    # a line is at most ~60 characters, or one flag with a long value (this test's tmp path)
    assert all(len(line) <= 66 or line.strip().count("--") == 1 for line in block.splitlines()), block
    joined = block.replace(" \\\n    ", " ")  # what a shell reads from the continued lines
    assert TRAIN_FULL in joined and empty_store.train_hint in joined
