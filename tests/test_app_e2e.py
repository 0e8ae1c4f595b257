"""End to end: `python app.py` on a free port, driven with gradio_client: no checkpoint yet,
hot reload of a new one, summarize, model_info, bad input, a corrupt checkpoint skipped."""
from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from b2b import B2BConfig, Bert2Bert, Tokenizer, save_checkpoint

REPO = Path(__file__).resolve().parents[1]
STARTUP_SECONDS = 120  # gradio + mlx imports on a busy 2-core machine


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_tiny_checkpoint(root: Path, step: int, **config) -> str:
    """A tiny model's checkpoint (B2BConfig overrides in `config`) at `step` of run `root/run`."""
    path = root / "run" / "checkpoints" / f"step_{step:07d}"
    model = Bert2Bert(B2BConfig.preset("tiny", **config))
    save_checkpoint(model, Tokenizer.default(), str(path), extra={"trainer_state.json": {"step": step}})
    return str(path)


def _die_with_parent() -> None:
    """In the child before exec (Linux): end the server when pytest itself is killed, where
    the `finally` below never runs."""
    if sys.platform.startswith("linux"):
        import ctypes
        import signal

        ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


@contextlib.contextmanager
def launch_app(watch: Path, log_path: Path, *extra: str):
    """Start app.py on a free port; yield its URL; stop it. Fails with the log's tail if the
    app does not answer within STARTUP_SECONDS."""
    port = free_port()
    env = dict(os.environ, HF_HUB_OFFLINE="1", GRADIO_ANALYTICS_ENABLED="False", PYTHONUNBUFFERED="1")
    cmd = [sys.executable, "app.py", "--port", str(port), "--watch", str(watch), "--poll-seconds", "0.5", "--fallback", ""]
    with open(log_path, "w") as log:
        proc = subprocess.Popen([*cmd, *extra], cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
                                preexec_fn=_die_with_parent)
    url = f"http://127.0.0.1:{port}/"
    try:
        deadline = time.time() + STARTUP_SECONDS
        while True:
            if proc.poll() is not None:
                pytest.fail(f"app.py exited with {proc.returncode}:\n{log_path.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(url, timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.time() > deadline:
                pytest.fail(f"app.py did not answer in {STARTUP_SECONDS} s:\n{log_path.read_text()[-3000:]}")
            time.sleep(0.5)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def wait_for(predicate, seconds: float = 30.0, every: float = 0.5):
    deadline = time.time() + seconds
    while True:
        value = predicate()
        if value or time.time() > deadline:
            return value
        time.sleep(every)


def test_app_end_to_end(tmp_path):
    from gradio_client import Client
    from gradio_client.exceptions import AppError

    watch = tmp_path / "logs"
    watch.mkdir()
    with launch_app(watch, tmp_path / "app.log") as url:
        client = Client(url, verbose=False)
        api = client.view_api(print_info=False, return_format="dict")["named_endpoints"]
        assert {"/summarize", "/model_info"} <= set(api)

        # No checkpoint anywhere: the app is up and says so; summarize is one sentence.
        info = client.predict(api_name="/model_info")
        assert info["status"] == "no checkpoint" and "train.finetune" in info["how_to_get_one"]
        with pytest.raises(AppError, match="No checkpoint is loaded yet"):
            client.predict("Some text.", api_name="/summarize")

        # Training writes a checkpoint: it is served without a restart.
        first = write_tiny_checkpoint(watch, 1)
        info = wait_for(lambda: (i := client.predict(api_name="/model_info"))["step"] == 1 and i)
        assert info and info["checkpoint"] == first and info["blas"] and info["config"]["hidden_size"] == 32

        text = "The council approved the new bridge on Tuesday."
        summary = client.predict(text, max_length=8, min_length=0, api_name="/summarize")
        assert isinstance(summary, str) and summary
        sampled = client.predict(text, strategy="sampling", seed=1, max_length=5, min_length=0, api_name="/summarize")
        assert isinstance(sampled, str)
        with pytest.raises(AppError, match="no text to summarize"):
            client.predict("   ", api_name="/summarize")
        with pytest.raises(AppError, match="Beams must be between"):
            client.predict("Text.", num_beams=99, api_name="/summarize")

        # A newer checkpoint replaces it; a corrupt one after that is skipped with a warning.
        second = write_tiny_checkpoint(watch, 2)
        info = wait_for(lambda: (i := client.predict(api_name="/model_info"))["step"] == 2 and i)
        assert info and info["checkpoint"] == second
        bad = write_tiny_checkpoint(watch, 3)
        with open(os.path.join(bad, "model.safetensors"), "r+b") as f:
            f.truncate(64)
        info = wait_for(lambda: (i := client.predict(api_name="/model_info"))["warning"] and i)
        assert info and "step_0000003" in info["warning"] and info["step"] == 2
        assert isinstance(client.predict("Still serving?", max_length=4, min_length=0, api_name="/summarize"), str)
