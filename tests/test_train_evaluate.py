"""train.evaluate: the command-line ROUGE report (model and Lead-3) on both CNN/DM layouts."""
from __future__ import annotations

import csv
import json
import pathlib

import pytest

from b2b import lead3, rouge_scores, save_checkpoint
from train import evaluate
from train.data import load_summarization_pairs

from conftest import FIXTURES


@pytest.fixture
def tiny_checkpoint(tmp_path, tiny_model, tokenizer) -> str:
    return save_checkpoint(tiny_model, tokenizer, str(tmp_path / "ckpt"))


@pytest.mark.parametrize("data", ["cnndm_sample.jsonl", "cnndm_tok_sample.jsonl.gz"])
def test_evaluate_cli_writes_json_and_csv(tmp_path, tiny_checkpoint, data, capsys):
    out = tmp_path / "r.json"
    path = str(FIXTURES / data)
    rc = evaluate.main([
        "--checkpoint", tiny_checkpoint, "--data", path, "--split", "validation", "--limit", "4",
        "--max-length", "8", "--out", str(out),
    ])
    assert rc == 0
    report = json.loads(out.read_text())
    assert report["n"] == 4
    for name in ("model", "lead3"):
        assert set(report[name]) == {"rouge1", "rouge2", "rougeLsum"}
        assert all(0.0 <= v <= 100.0 for v in report[name].values())
    assert report["settings"]["max_length"] == 8 and report["settings"]["limit"] == 4

    # Lead-3 is scored with the same code on the same (joined) references.
    pairs = load_summarization_pairs(path, limit=4)
    expected = rouge_scores([lead3(a) for a in pairs.articles], pairs.summaries)
    assert report["lead3"]["rouge1"] == pytest.approx(expected.rouge1, abs=0.01)
    assert report["lead3"]["rouge1"] > 5  # Lead-3 overlaps the highlights; an untrained model needn't

    with open(tmp_path / "r.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 4
    assert {"article", "reference", "generated", "rouge1", "rouge2", "rougeLsum"} <= set(rows[0])
    assert [r["reference"] for r in rows] == pairs.summaries
    assert "ROUGE-1" in capsys.readouterr().out


def test_default_report_names_the_article_count(tiny_checkpoint, capsys):
    # A quick run on a few articles must not overwrite the report of a longer one.
    common = ["--checkpoint", tiny_checkpoint, "--data", str(FIXTURES / "cnndm_sample.jsonl"), "--max-length", "4"]
    assert evaluate.main(common + ["--limit", "3"]) == 0
    assert evaluate.main(common + ["--limit", "2"]) == 0
    names = sorted(p.name for p in pathlib.Path(tiny_checkpoint).glob("eval_*"))
    assert names == ["eval_cnndm_sample_first2_beam1.csv", "eval_cnndm_sample_first2_beam1.json",
                     "eval_cnndm_sample_first3_beam1.csv", "eval_cnndm_sample_first3_beam1.json"]
    first3 = json.loads((pathlib.Path(tiny_checkpoint) / "eval_cnndm_sample_first3_beam1.json").read_text())
    assert first3["n"] == 3


def test_skip_scores_the_articles_after_the_first(tiny_checkpoint, caplog):
    common = ["--checkpoint", tiny_checkpoint, "--data", str(FIXTURES / "cnndm_sample.jsonl"), "--max-length", "4"]
    assert evaluate.main(common + ["--skip", "2", "--limit", "2"]) == 0
    report_path = pathlib.Path(tiny_checkpoint) / "eval_cnndm_sample_from3_2_beam1.csv"
    with open(report_path, newline="") as f:
        rows = list(csv.DictReader(f))
    pairs = load_summarization_pairs(str(FIXTURES / "cnndm_sample.jsonl"), limit=4)
    assert [r["reference"] for r in rows] == pairs.summaries[2:4]
    available = len(load_summarization_pairs(str(FIXTURES / "cnndm_sample.jsonl")))
    assert evaluate.main(common + ["--skip", str(available)]) == 2
    assert f"--skip {available} leaves no articles" in caplog.text


def test_evaluate_cli_reports_a_missing_checkpoint(tmp_path, caplog):
    rc = evaluate.main(["--checkpoint", str(tmp_path / "none"), "--data", str(FIXTURES / "cnndm_sample.jsonl"), "--limit", "2"])
    assert rc != 0
    assert "No checkpoint folder" in caplog.text


def test_the_default_source_length_is_the_checkpoints_and_the_report_names_it(tmp_path, tiny_model, tokenizer):
    tiny_model.trained_source_length = 24
    try:
        ckpt = save_checkpoint(tiny_model, tokenizer, str(tmp_path / "trained"))
    finally:
        tiny_model.trained_source_length = None
    path = str(FIXTURES / "cnndm_sample.jsonl")
    for extra, expected in (([], 24), (["--max-source-length", "40"], 40)):
        out = tmp_path / f"r{expected}.json"
        assert evaluate.main(["--checkpoint", ckpt, "--data", path, "--limit", "2", "--max-length", "4", "--out", str(out), *extra]) == 0
        assert json.loads(out.read_text())["settings"]["max_source_length"] == expected


@pytest.mark.parametrize("extra, message", [
    (["--batch-size", "0"], "--batch-size must be at least 1"),
    (["--num-beams", "0"], "num_beams must be at least 1"),
    (["--min-length", "9", "--max-length", "4"], "must be at least min_length"),
])
def test_bad_settings_fail_before_the_checkpoint_is_loaded(tmp_path, extra, message, caplog, monkeypatch):
    def no_loading(*_):
        raise AssertionError("the checkpoint was loaded before the settings were checked")

    monkeypatch.setattr(evaluate, "load_for_decoding", no_loading)
    args = ["--checkpoint", str(tmp_path), "--data", str(FIXTURES / "cnndm_sample.jsonl"), "--out", str(tmp_path / "r.json")]
    assert evaluate.main(args + extra) == 2
    assert message in caplog.text


def test_report_folder_is_made_up_front_and_an_unwritable_one_is_an_error(tmp_path, tiny_checkpoint, caplog):
    common = ["--checkpoint", tiny_checkpoint, "--data", str(FIXTURES / "cnndm_sample.jsonl"), "--limit", "2", "--max-length", "4"]
    out = tmp_path / "new" / "folder" / "r.json"
    assert evaluate.main(common + ["--out", str(out)]) == 0
    assert json.loads(out.read_text())["n"] == 2
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    assert evaluate.main(common + ["--out", str(blocker / "r.json")]) == 2  # a folder under a file
    assert "Cannot write the report" in caplog.text
