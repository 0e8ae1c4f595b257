"""A running `train.finetune` process: its TensorBoard curve grows on disk while it trains, and
Ctrl-C (SIGINT) makes it save a checkpoint and exit with code 130."""
from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

from train.checkpoints import TrainerState, list_checkpoints
from train.writer import read_metrics

from conftest import FIXTURES, REPO

event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")


def loss_points(run_dir) -> int:
    """Number of `train/loss` scalars in the run's TensorBoard event files (0 before any)."""
    if not any(p.name.startswith("events.out.tfevents") for p in run_dir.glob("*")):
        return 0
    acc = event_accumulator.EventAccumulator(str(run_dir), size_guidance={event_accumulator.SCALARS: 0})
    acc.Reload()
    if "train/loss" not in acc.Tags()["scalars"]:
        return 0
    return len(acc.Scalars("train/loss"))


def test_live_events_then_ctrl_c(tmp_path):
    run_dir = tmp_path / "run"
    args = [
        "--preset", "tiny", "--data", str(FIXTURES / "cnndm_tok_sample.jsonl.gz"), "--out", str(run_dir),
        "--max-source-len", "64", "--max-target-len", "24", "--batch-size", "4", "--rouge-examples", "0",
        "--val-examples", "8", "--max-steps", "100000", "--log-every", "1", "--eval-every", "0",
        "--save-every", "0", "--flush-secs", "0.5",
    ]
    log_path = tmp_path / "run.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "train.finetune", *args], cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 60
        first = 0
        while first == 0:
            assert proc.poll() is None, log_path.read_text()
            assert time.time() < deadline, "no train/loss event after 60 s"
            time.sleep(0.2)
            first = loss_points(run_dir)
        deadline = time.time() + 20
        second = first
        while second <= first and time.time() < deadline:
            time.sleep(0.5)
            second = loss_points(run_dir)
        assert proc.poll() is None, "the run ended by itself"
        assert second > first, "the event file did not grow while the run went on"

        proc.send_signal(signal.SIGINT)
        rc = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    output = log_path.read_text()
    assert rc == 130, output  # 128 + SIGINT: a script running it sees that it did not finish
    assert "Stopping: saving a checkpoint" in output and "Traceback" not in output
    assert "continue with --resume" in output
    ckpts = list_checkpoints(str(run_dir))
    assert len(ckpts) == 1  # --save-every 0: only the one saved on Ctrl-C
    step, path = ckpts[0]
    assert TrainerState.load(path).step == step >= second
    # Everything up to the interruption reached both files.
    assert read_metrics(str(run_dir))["train/loss"][-1][0] == step
    assert loss_points(run_dir) == step
