"""The training commands facing bad input: unusable data, a run folder that is already in use,
and losses that turn non-finite. Each ends with a non-zero code and one logged sentence."""
from __future__ import annotations

import json
import os

import mlx.core as mx
import numpy as np
import pytest

from train import finetune, pretrain
from train.checkpoints import TrainerState, list_checkpoints
from train.finetune import SummarizationTask
from train.losses import seq2seq_loss
from train.writer import read_metrics

from conftest import FIXTURES

SMALL = [
    "--preset", "tiny", "--max-source-len", "64", "--max-target-len", "24", "--batch-size", "4",
    "--rouge-examples", "0", "--val-examples", "8", "--warmup-steps", "0", "--log-every", "1", "--eval-every", "0",
]
TOK_DATA = str(FIXTURES / "cnndm_tok_sample.jsonl.gz")
PAIR = {"article": "the cat sat on the mat . it was a sunny day .", "highlights": "a cat sat ."}


def write_lines(path, lines: list[str]) -> str:
    path.write_text("".join(line + "\n" for line in lines))
    return str(path)


def assert_nothing_trained(out) -> None:
    assert not os.path.exists(out)  # not even an empty run folder


@pytest.mark.parametrize(
    "name, lines, expected",
    [
        ("malformed.jsonl", [json.dumps(PAIR)] * 2 + ['{"article": "cut off'], ["malformed.jsonl line 3", "not valid JSON"]),
        (
            "fields.jsonl",
            [json.dumps({"text": "an article", "summary": "a summary"})],
            ["fields.jsonl line 1", "no field 'article'", "text, summary"],
        ),
        ("empty.jsonl", [], ["empty.jsonl has no usable pairs"]),
        ("blank.jsonl", [json.dumps({"article": " ", "highlights": "x"})] * 3, ["no usable pairs (3 had an empty"]),
        ("few.jsonl", [json.dumps(PAIR)] * 3, ["Not enough data for one optimizer step"]),
    ],
)
def test_bad_data_is_refused_before_training(tmp_path, caplog, name, lines, expected):
    data = write_lines(tmp_path / name, lines)
    out = tmp_path / "run"
    rc = finetune.main(SMALL + ["--data", data, "--out", str(out), "--max-steps", "2"])
    assert rc != 0
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 1, caplog.text
    for part in expected:
        assert part in errors[0]
    assert_nothing_trained(out)


def test_missing_data_file(tmp_path, caplog):
    missing = str(tmp_path / "nowhere.jsonl")
    assert finetune.main(SMALL + ["--data", missing, "--out", str(tmp_path / "run"), "--max-steps", "2"]) != 0
    assert f"{missing} does not exist" in caplog.text


def test_run_folder_with_checkpoints_needs_resume(tmp_path, caplog):
    out = tmp_path / "run"
    args = SMALL + ["--data", TOK_DATA, "--limit", "12", "--out", str(out), "--max-steps", "2", "--save-every", "1"]
    assert finetune.main(args) == 0
    before = list_checkpoints(str(out))
    metrics = (out / "metrics.jsonl").read_text()
    caplog.clear()
    assert finetune.main(args) != 0
    assert "already holds checkpoints: pass --resume to continue it, or choose another --out." in caplog.text
    assert list_checkpoints(str(out)) == before
    assert (out / "metrics.jsonl").read_text() == metrics


POISON = 1  # [unused0]: written over [CLS] to mark the batches whose loss becomes NaN


def poison(monkeypatch, when) -> None:
    """Make the summarization loss NaN on the batches where `when(epoch, index, step)` holds."""
    batch = SummarizationTask.batch

    def poisoned_batch(self, epoch, index, step):
        b = batch(self, epoch, index, step)
        if when(epoch, index, step):
            b.arrays[0][:, 0] = POISON
        return b

    def poisoned_loss(self, model, src, mask, tgt):
        loss, aux = seq2seq_loss(model, src, mask, tgt)
        return mx.where(src[0, 0] == POISON, mx.array(float("nan")), loss), aux

    monkeypatch.setattr(SummarizationTask, "batch", poisoned_batch)
    monkeypatch.setattr(SummarizationTask, "loss", poisoned_loss)


def test_one_nonfinite_loss_is_skipped_and_counted(tmp_path, monkeypatch, caplog):
    poison(monkeypatch, lambda epoch, index, step: (epoch, index) == (0, 2))
    out = tmp_path / "run"
    assert finetune.main(SMALL + ["--data", TOK_DATA, "--limit", "40", "--out", str(out), "--max-steps", "5"]) == 0
    assert "Non-finite loss at step 2: update skipped (1 in a row)." in caplog.text
    metrics = read_metrics(str(out))
    assert metrics["train/nonfinite_steps"] == [(2, 1.0)]
    steps, losses = zip(*metrics["train/loss"])
    assert steps == (1, 2, 3, 4, 5) and np.isfinite(losses).all()
    state = TrainerState.load(list_checkpoints(str(out))[-1][1])
    assert state.step == 5 and state.nonfinite_steps == 1
    assert state.batch_in_epoch == 6 and state.examples_seen == 5 * 4  # the bad batch is passed over, not counted


def test_repeated_nonfinite_losses_stop_the_run(tmp_path, monkeypatch, caplog):
    poison(monkeypatch, lambda epoch, index, step: step >= 2)
    out = tmp_path / "run"
    args = SMALL + ["--data", TOK_DATA, "--limit", "40", "--out", str(out), "--max-steps", "10", "--save-every", "1"]
    assert finetune.main(args + ["--max-bad-steps", "3"]) == 1
    last = list_checkpoints(str(out))[-1][1]
    assert os.path.basename(last) == "step_0000002"
    assert f"3 non-finite losses in a row at step 2: lower --lr or check the data; the last good checkpoint is {last}." in caplog.text
    assert read_metrics(str(out))["train/nonfinite_steps"][-1] == (2, 3.0)
    weights = mx.load(os.path.join(last, "model.safetensors"))
    assert all(np.isfinite(np.array(w)).all() for w in weights.values())


def test_pretrain_stops_on_exploding_lr(tmp_path, caplog):
    """No monkeypatching: --lr 1e30 wrecks the weights after one step; the command says so."""
    out = tmp_path / "run"
    rc = pretrain.main([
        "--preset", "tiny", "--data", str(FIXTURES / "wikitext_sample.tokens"), "--block-size", "32",
        "--batch-size", "4", "--val-batches", "1", "--lr", "1e30", "--warmup-steps", "0", "--max-steps", "10",
        "--save-every", "1", "--eval-every", "0", "--max-bad-steps", "2", "--out", str(out),
    ])
    assert rc == 1
    assert "2 non-finite losses in a row" in caplog.text and "lower --lr" in caplog.text
    assert [s for s, _ in list_checkpoints(str(out))] == [1]
    assert "Traceback" not in caplog.text


@pytest.mark.parametrize(
    "flag, value, message",
    [
        ("--lr", "0", "--lr must be positive."),
        ("--log-every", "0", "--log-every must be at least 1."),
        ("--save-every", "-1", "--eval-every and --save-every cannot be negative"),
        ("--eval-every", "-5", "--eval-every and --save-every cannot be negative"),
        ("--keep-last", "0", "--keep-last must be at least 1"),
        ("--max-bad-steps", "0", "--max-bad-steps must be at least 1."),
        ("--coverage", "-1", "--coverage must be >= 0"),
    ],
)
def test_impossible_settings_are_refused_by_the_parser(tmp_path, capsys, flag, value, message):
    with pytest.raises(SystemExit) as exit_info:
        finetune.main(SMALL + ["--data", TOK_DATA, "--out", str(tmp_path / "run"), flag, value])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_nonfinite_gradient_with_a_finite_loss_is_skipped(tmp_path, monkeypatch, caplog):
    """A NaN gradient under a finite loss: without a check, clipping by a NaN norm would turn
    every weight into NaN. The update is skipped and counted like a non-finite loss."""

    @mx.custom_function
    def nan_gradient(x, flag):  # adds 0 to the loss; its gradient is NaN where `flag` holds
        return (x * 0).sum()

    @nan_gradient.vjp
    def nan_gradient_vjp(primals, cotangent, output):
        x, flag = primals
        return mx.where(flag, mx.full(x.shape, float("nan")), mx.zeros_like(x)), mx.zeros_like(flag)

    batch = SummarizationTask.batch

    def poisoned_batch(self, epoch, index, step):
        b = batch(self, epoch, index, step)
        if (epoch, index) == (0, 2):
            b.arrays[0][:, 0] = POISON
        return b

    def poisoned_loss(self, model, src, mask, tgt):
        loss, aux = seq2seq_loss(model, src, mask, tgt)
        return loss + nan_gradient(model.encoder.layers[0].ffn.up.weight, src[0, 0] == POISON), aux

    monkeypatch.setattr(SummarizationTask, "batch", poisoned_batch)
    monkeypatch.setattr(SummarizationTask, "loss", poisoned_loss)
    out = tmp_path / "run"
    assert finetune.main(SMALL + ["--data", TOK_DATA, "--limit", "40", "--out", str(out), "--max-steps", "4"]) == 0
    assert "Non-finite gradient norm at step 2 (loss " in caplog.text and "update skipped (1 in a row)." in caplog.text
    metrics = read_metrics(str(out))
    assert metrics["train/nonfinite_steps"] == [(2, 1.0)]
    assert np.isfinite([v for _, v in metrics["train/grad_norm"]]).all()
    last = list_checkpoints(str(out))[-1][1]
    assert TrainerState.load(last).nonfinite_steps == 1
    weights = mx.load(os.path.join(last, "model.safetensors"))
    assert all(np.isfinite(np.array(w)).all() for w in weights.values())


def test_skipped_pairs_are_reported_once(tmp_path, caplog, tokenizer):
    from train.finetune import FinetuneSettings

    data = write_lines(tmp_path / "pairs.jsonl", [json.dumps(PAIR)] * 10 + [json.dumps({"article": "", "highlights": "x"})] * 2)
    caplog.set_level("INFO")
    SummarizationTask(FinetuneSettings(data=data, max_source_len=32, max_target_len=16), tokenizer, 512)
    assert sum("Skipped 2 pairs" in r.getMessage() for r in caplog.records) == 1, caplog.text


def test_coverage_without_a_pointer_is_refused(tmp_path, caplog):
    rc = finetune.main(SMALL + ["--data", TOK_DATA, "--out", str(tmp_path / "run"), "--max-steps", "2", "--coverage", "1"])
    assert rc != 0
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 1 and "add --pointer-generator" in errors[0], caplog.text


def test_coverage_run_logs_both_parts_of_its_loss(tmp_path):
    out = tmp_path / "run"
    rc = finetune.main(SMALL + ["--data", TOK_DATA, "--out", str(out), "--max-steps", "2", "--pointer-generator", "--coverage", "1"])
    assert rc == 0
    tags = {tag: series[-1][1] for tag, series in read_metrics(out / "metrics.jsonl").items()}
    assert tags["train/coverage"] > 0
    assert abs(tags["train/loss"] - (tags["train/nll"] + tags["train/coverage"])) < 1e-3
