"""Resume through the commands (train.finetune / train.pretrain): an interrupted-and-resumed run
ends with the same weights, optimizer moments and curve as an uninterrupted one, also after a
SIGKILL."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import mlx.core as mx
import numpy as np
import pytest

from train import finetune, pretrain
from train.checkpoints import TrainerState, list_checkpoints
from train.writer import read_metrics

from conftest import FIXTURES, REPO

# --limit 20 (19 training pairs, 4 batches of 4) with --grad-accum 2: two steps per epoch, so the
# runs below cross epoch boundaries; dropout is on so the per-step RNG matters too.
FINETUNE = [
    "--preset", "tiny", "--data", str(FIXTURES / "cnndm_tok_sample.jsonl.gz"), "--limit", "20",
    "--max-source-len", "64", "--max-target-len", "24", "--batch-size", "4", "--grad-accum", "2",
    "--rouge-examples", "0", "--val-examples", "8", "--dropout", "0.1", "--lr", "1e-3",
    "--warmup-steps", "2", "--log-every", "1", "--eval-every", "3", "--seed", "3",
]
PRETRAIN = [
    "--preset", "tiny", "--data", str(FIXTURES / "wikitext_sample.tokens"), "--block-size", "32",
    "--batch-size", "4", "--val-batches", "2", "--dropout", "0.1", "--lr", "1e-3", "--warmup-steps", "2",
    "--log-every", "1", "--eval-every", "3", "--seed", "3",
]
COMMANDS = {"finetune": (finetune.main, FINETUNE), "pretrain": (pretrain.main, PRETRAIN)}


def last_checkpoint(run_dir) -> str:
    ckpts = list_checkpoints(str(run_dir))
    assert ckpts, f"no checkpoint in {run_dir}"
    return ckpts[-1][1]


def assert_same_tensors(a_path: str, b_path: str) -> None:
    a, b = mx.load(a_path), mx.load(b_path)
    assert a.keys() == b.keys()
    for k in a:
        assert np.allclose(np.array(a[k]), np.array(b[k]), rtol=1e-6, atol=1e-7), k


@pytest.mark.parametrize("resume_flags", ["all", "changed only"])
@pytest.mark.parametrize("command", ["finetune", "pretrain"])
def test_resumed_run_matches_uninterrupted_run(tmp_path, command, resume_flags):
    """Resumed with the original flags, or with only the ones that change (the rest, data and
    preset included, come from the run's settings.json)."""
    main, args = COMMANDS[command]
    N, k = 7, 3
    full, split = tmp_path / "full", tmp_path / "split"
    assert main(args + ["--out", str(full), "--max-steps", str(N), "--save-every", str(k)]) == 0
    assert main(args + ["--out", str(split), "--max-steps", str(k), "--save-every", str(k)]) == 0
    # The schedule is that of an N-step run; a k-step run would decay faster. Resume with N.
    again = args if resume_flags == "all" else []
    assert main(again + ["--out", str(split), "--max-steps", str(N), "--save-every", str(k), "--resume"]) == 0

    a, b = last_checkpoint(full), last_checkpoint(split)
    assert os.path.basename(a) == os.path.basename(b) == f"step_{N:07d}"
    assert_same_tensors(os.path.join(a, "model.safetensors"), os.path.join(b, "model.safetensors"))
    assert_same_tensors(os.path.join(a, "optimizer.safetensors"), os.path.join(b, "optimizer.safetensors"))
    sa, sb = TrainerState.load(a), TrainerState.load(b)
    assert (sa.step, sa.epoch, sa.batch_in_epoch, sa.examples_seen) == (sb.step, sb.epoch, sb.batch_in_epoch, sb.examples_seen)
    if command == "finetune":
        assert sa.epoch >= 2  # the data position crossed epochs

    ma, mb = read_metrics(str(full)), read_metrics(str(split))
    for tag in ("train/loss", "train/lr", "train/grad_norm", "val/loss"):
        steps_a, values_a = zip(*ma[tag])
        steps_b, values_b = zip(*mb[tag])
        assert steps_a == steps_b, tag
        assert np.allclose(values_a, values_b, rtol=1e-5), (tag, ma[tag], mb[tag])
    assert [s for s, _ in ma["train/loss"]] == list(range(1, N + 1))


def test_resume_after_sigkill(tmp_path, caplog):
    """kill -9 a run that saves every step (likely mid-write); --resume continues from the last
    complete checkpoint, cleans the half-written one and ends like an uninterrupted run."""
    N = 8
    args = FINETUNE + ["--max-steps", str(N), "--save-every", "1", "--eval-every", "0"]
    run_dir = tmp_path / "killed"
    log = open(tmp_path / "killed.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "train.finetune", *args, "--out", str(run_dir)],
        cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
    )
    try:
        root = run_dir / "checkpoints"
        deadline = time.time() + 60
        while not list_checkpoints(str(run_dir)):
            assert proc.poll() is None, (tmp_path / "killed.log").read_text()
            assert time.time() < deadline, "no checkpoint after 60 s"
            time.sleep(0.01)
        # Prefer to kill while the next checkpoint is being written.
        deadline = time.time() + 3
        while time.time() < deadline and proc.poll() is None:
            if any(name.endswith(".tmp") for name in os.listdir(root)):
                break
            time.sleep(0.002)
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(timeout=30) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()

    complete = list_checkpoints(str(run_dir))
    assert complete
    if complete[-1][0] == N:
        pytest.skip("the run finished before it could be killed")
    last_step = complete[-1][0]

    caplog.set_level("INFO")
    assert finetune.main(args + ["--out", str(run_dir), "--resume"]) == 0
    assert f"at step {last_step} " in caplog.text
    assert not [n for n in os.listdir(root) if n.endswith((".tmp", ".old"))]
    final = last_checkpoint(run_dir)
    assert TrainerState.load(final).step == N
    # The curve has one point per step (the killed run's later points are replaced).
    assert [s for s, _ in read_metrics(str(run_dir))["train/loss"]] == list(range(1, N + 1))

    reference = tmp_path / "reference"
    assert finetune.main(args + ["--out", str(reference)]) == 0
    assert_same_tensors(os.path.join(final, "model.safetensors"), os.path.join(last_checkpoint(reference), "model.safetensors"))


def test_resume_refuses_flags_that_make_another_run(tmp_path, capsys):
    """Data, model and length limits belong to the run: a resume that changes them is refused
    with one sentence, before anything is written; schedule-like flags may change."""
    out = tmp_path / "run"
    args = FINETUNE + ["--out", str(out), "--save-every", "2"]
    assert finetune.main(args + ["--max-steps", "2"]) == 0
    before = list_checkpoints(str(out))
    settings = (out / "settings.json").read_text()
    for flag, value in [("--max-source-len", "32"), ("--preset", "seed"), ("--data", str(FIXTURES / "cnndm_sample.jsonl")),
                        ("--share", None), ("--rouge-examples", "2")]:
        with pytest.raises(SystemExit) as exit_info:
            finetune.main(args + ["--max-steps", "4", "--resume", flag] + ([value] if value else []))
        assert exit_info.value.code == 2
        err = capsys.readouterr().err
        assert "--resume cannot" in err and flag in err, err
    assert list_checkpoints(str(out)) == before
    assert (out / "settings.json").read_text() == settings
    # The same flags, or new --max-steps / --eval-every / --save-every, continue the run.
    assert finetune.main(args + ["--max-steps", "4", "--eval-every", "2", "--resume"]) == 0
    assert TrainerState.load(last_checkpoint(out)).step == 4


def test_resume_without_a_checkpoint_takes_the_flags_as_given(tmp_path):
    """A run folder with settings.json but no checkpoint (it failed early) has nothing to
    continue: --resume starts afresh with the flags given, even different ones."""
    out = tmp_path / "run"
    out.mkdir()
    (out / "settings.json").write_text('{"preset": "seed", "max_source_len": 512, "limit": 3}')
    assert finetune.main(FINETUNE + ["--out", str(out), "--max-steps", "1", "--resume"]) == 0
    assert TrainerState.load(last_checkpoint(out)).step == 1


def test_resume_with_a_broken_settings_file_is_one_sentence(tmp_path, tiny_model, tokenizer, capsys):
    import pytest

    from b2b import save_checkpoint
    from train.checkpoints import STATE
    from train.finetune import FinetuneSettings
    from train.settings import parse_settings

    ckpt = save_checkpoint(tiny_model, tokenizer, str(tmp_path / "checkpoints" / "step_0000001"))
    (tmp_path / "checkpoints" / "step_0000001" / STATE).write_text("{}")
    (tmp_path / "settings.json").write_text('{"batch_size": 8, "lr"')  # cut off mid-write
    with pytest.raises(SystemExit) as stop:
        parse_settings(FinetuneSettings, ["--data", "x.jsonl", "--out", str(tmp_path), "--resume"])
    assert stop.value.code == 2
    assert "settings.json is unreadable" in capsys.readouterr().err


def test_a_run_saved_before_a_setting_existed_resumes_as_it_ran(tmp_path, tiny_model, tokenizer):
    """Runs saved before --keep-update-labels existed kept CNN's "NEW:" label: resumed, they
    keep it, and switching it is refused like any change of data."""
    import json

    from b2b import save_checkpoint
    from train.checkpoints import STATE
    from train.finetune import FinetuneSettings
    from train.settings import parse_settings

    save_checkpoint(tiny_model, tokenizer, str(tmp_path / "checkpoints" / "step_0000001"))
    (tmp_path / "checkpoints" / "step_0000001" / STATE).write_text("{}")
    (tmp_path / "settings.json").write_text(json.dumps({"data": "x.jsonl", "batch_size": 8}))
    resumed = parse_settings(FinetuneSettings, ["--out", str(tmp_path), "--resume"])
    assert resumed.keep_update_labels is True and resumed.batch_size == 8
    assert resumed.keep_open_sentences is True  # nor did they end summary lines with a full stop
    with pytest.raises(SystemExit):
        parse_settings(FinetuneSettings, ["--out", str(tmp_path), "--resume", "--no-keep-update-labels"])
    assert parse_settings(FinetuneSettings, ["--data", "x.jsonl"]).keep_update_labels is False  # new runs
    # Nor had they a pointer-generator: a resume may not add one (its weights are not in the checkpoint).
    assert resumed.pointer_generator is False
    with pytest.raises(SystemExit):
        parse_settings(FinetuneSettings, ["--out", str(tmp_path), "--resume", "--pointer-generator"])
