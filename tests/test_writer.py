"""Tests for train/writer.py: metrics.jsonl, live TensorBoard events, tolerant reading."""
from __future__ import annotations

import glob
import json
import time

import numpy as np
import pytest

from train.writer import METRICS_FILE, SETTINGS_TAG, MetricWriter, read_metrics, read_texts


def jsonl_lines(log_dir) -> list[dict]:
    return [json.loads(line) for line in (log_dir / METRICS_FILE).read_text().splitlines()]


def test_metrics_jsonl_lines(tmp_path):
    with MetricWriter(str(tmp_path), use_tensorboard=False) as w:
        w.scalar("train/loss", np.float32(2.5), 10)
        w.scalars({"train/lr": 1e-4, "train/grad_norm": 0.7}, 10)
        w.text("val/sample", "a summary\nline two", 20)
        w.hparams({"lr": 1e-4, "model": {"layers": 2}})
        w.flush()
        lines = jsonl_lines(tmp_path)  # visible while the writer is still open
    assert [(d["tag"], d["step"]) for d in lines] == [
        ("train/loss", 10), ("train/lr", 10), ("train/grad_norm", 10), ("val/sample", 20), (SETTINGS_TAG, 0)
    ]
    assert lines[0]["value"] == 2.5 and isinstance(lines[0]["time"], float)
    assert lines[3]["text"] == "a summary\nline two"
    assert json.loads(lines[4]["text"]) == {"lr": 1e-4, "model": {"layers": 2}}
    assert read_metrics(str(tmp_path)) == {"train/loss": [(10, 2.5)], "train/lr": [(10, 1e-4)], "train/grad_norm": [(10, 0.7)]}
    assert read_texts(str(tmp_path / METRICS_FILE))["val/sample"] == [(20, "a summary\nline two")]


def test_lines_reach_disk_without_explicit_flush(tmp_path):
    w = MetricWriter(str(tmp_path), flush_secs=0.05, use_tensorboard=False)
    try:
        w.scalar("train/loss", 1.0, 1)
        deadline = time.time() + 5
        while not read_metrics(str(tmp_path)) and time.time() < deadline:
            time.sleep(0.02)
        assert read_metrics(str(tmp_path)) == {"train/loss": [(1, 1.0)]}
    finally:
        w.close()


def test_tensorboard_events_readable_while_open(tmp_path):
    event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    w = MetricWriter(str(tmp_path), flush_secs=60)
    try:
        for step in range(5):
            w.scalar("train/loss", 3.0 - step * 0.5, step)
        w.text("val/sample", "hello", 4)
        w.flush()
        assert glob.glob(str(tmp_path / "events.out.tfevents.*"))
        acc = event_accumulator.EventAccumulator(str(tmp_path))
        acc.Reload()
        assert "train/loss" in acc.Tags()["scalars"]
        events = acc.Scalars("train/loss")
        assert [e.step for e in events] == list(range(5))
        assert events[-1].value == pytest.approx(1.0)
    finally:
        w.close()
    w.close()  # closing twice is harmless
    with pytest.raises(ValueError, match="closed"):
        w.scalar("train/loss", 1.0, 6)


def test_read_metrics_tolerates_half_written_last_line(tmp_path):
    path = tmp_path / METRICS_FILE
    good = [{"step": s, "tag": "train/loss", "value": 1.0 / (s + 1), "time": 0.0} for s in range(3)]
    path.write_text("".join(json.dumps(d) + "\n" for d in good) + '{"step": 3, "tag": "train/lo')
    assert read_metrics(str(path)) == {"train/loss": [(0, 1.0), (1, 0.5), (2, 1 / 3)]}
    assert read_metrics(str(tmp_path / "missing")) == {}


def test_resume_appends_and_replaces_stale_points(tmp_path):
    with MetricWriter(str(tmp_path), use_tensorboard=False) as w:
        for step in range(1, 6):
            w.scalar("train/loss", 10.0 - step, step)
    with open(tmp_path / METRICS_FILE, "a") as f:
        f.write('{"step": 6, "tag": "train/lo')  # the run crashed mid-line
    # Resume from a checkpoint at step 3: steps 4-5 of the crashed run are stale.
    with MetricWriter(str(tmp_path), use_tensorboard=False) as w:
        w.scalar("train/loss", 0.5, 4)
        w.scalar("train/loss", 0.25, 5)
    text = (tmp_path / METRICS_FILE).read_text()
    assert text.count("\n") == 8  # 5 old + the repaired half line + 2 new, none merged
    assert read_metrics(str(tmp_path))["train/loss"] == [(1, 9.0), (2, 8.0), (3, 7.0), (4, 0.5), (5, 0.25)]


def test_purge_step_hides_the_interrupted_runs_later_events(tmp_path):
    event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    with MetricWriter(str(tmp_path)) as w:
        for step in range(1, 6):
            w.scalar("train/loss", 10.0, step)
    with MetricWriter(str(tmp_path), purge_step=4) as w:
        w.scalar("train/loss", 1.0, 4)
    acc = event_accumulator.EventAccumulator(str(tmp_path))
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("train/loss")] == [(1, 10.0), (2, 10.0), (3, 10.0), (4, 1.0)]
