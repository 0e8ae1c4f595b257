"""train.step.GradStep: a batch split across CPU threads gives the whole batch's loss, counts
and gradients (token-weighted), errors reach the caller, and the thread limits are restored."""
import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_flatten

from b2b import B2BConfig, Bert2Bert, runtime
from train.losses import seq2seq_loss
from train.step import GradStep, auto_shards


def _model():
    cfg = B2BConfig(vocab_size=120, hidden_size=64, num_heads=2, encoder_layers=2, decoder_layers=2, ffn_size=128,
                    max_positions=64, dropout=0.0)
    mx.random.seed(3)
    model = Bert2Bert(cfg)
    mx.eval(model.parameters())  # lazy arrays can only be evaluated in the thread that made them
    model.train()
    return model


def _batch(rows=5):
    rng = np.random.default_rng(0)
    src = rng.integers(5, 120, size=(rows, 30)).astype(np.int32)
    mask = (np.arange(30)[None, :] < rng.integers(8, 31, size=(rows, 1))).astype(np.int32)
    tgt = rng.integers(5, 120, size=(rows, 11)).astype(np.int32)
    tgt[:, -1] = 0
    tgt[1:3, 4:] = 0  # rows with very different numbers of scored tokens: the weights matter
    return src * mask, mask, tgt


@pytest.mark.parametrize("shards", [2, 3])
def test_shards_give_the_whole_batch_loss_and_gradients(shards):
    model = _model()
    arrays = _batch()
    whole = GradStep(model, seq2seq_loss, 1)
    split = GradStep(model, seq2seq_loss, shards)
    loss1, aux1, g1 = whole(0, *arrays)
    loss2, aux2, g2 = split(0, *arrays)
    assert abs(loss1.item() - loss2.item()) < 1e-5
    assert aux2[1].item() == aux1[1].item() == float((arrays[2][:, 1:] != 0).sum())  # counts are added
    for (name, a), (_, b) in zip(tree_flatten(g1), tree_flatten(g2)):
        assert float(mx.abs(a - b).max()) <= 1e-4 * float(mx.abs(a).max()) + 1e-7, name


@pytest.mark.parametrize("error", [ValueError, SystemExit])
def test_a_shard_error_reaches_the_caller_instead_of_hanging(error):
    """One shard fails (the 2-row one of 3 + 2), the other must not wait for it forever, and
    the shard threads live on for the next step."""
    import threading

    def picky_loss(model, src, mask, tgt):
        if src.shape[0] == 2:
            raise error("this shard fails")
        return seq2seq_loss(model, src, mask, tgt)

    step = GradStep(_model(), picky_loss, 2)
    caught = []

    def call():
        try:
            step(0, *_batch(5))
        except BaseException as e:
            caught.append(e)

    t = threading.Thread(target=call, daemon=True)
    t.start()
    t.join(60)
    assert not t.is_alive(), "the step hung"
    assert len(caught) == 1 and isinstance(caught[0], error) and "this shard fails" in str(caught[0])
    step = GradStep(_model(), seq2seq_loss, 2)
    assert np.isfinite(step(0, *_batch())[0].item())  # the same threads, working


def test_dropout_is_seeded():
    model = _model()
    for m in model.modules():
        if hasattr(m, "_p_1"):
            m._p_1 = 0.5  # dropout on
    step = GradStep(model, seq2seq_loss, 2)
    a, b, c = (step(seed, *_batch())[0].item() for seed in (1, 1, 2))
    assert a == b and a != c


def test_a_process_that_used_shards_exits_cleanly():
    """MLX aborts at exit when a thread whose stream ran compiled graphs ended first: the shard
    threads must outlive the steps that used them."""
    import subprocess
    import sys

    code = ("from tests.test_train_step import _model, _batch\n"
            "from train.step import GradStep\nfrom train.losses import seq2seq_loss\n"
            "step = GradStep(_model(), seq2seq_loss, 2)\nstep(0, *_batch())\ndel step\n"
            "step = GradStep(_model(), seq2seq_loss, 2)\nprint(step(1, *_batch())[0].item())\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert float(done.stdout.strip().splitlines()[-1]) > 0


def test_thread_limits_are_restored():
    before = runtime._blas_threads()
    with runtime.cpu_threads(1):
        assert runtime._blas_threads() in (1, None)
    assert runtime._blas_threads() == before


def test_auto_shards_one_per_core_at_most_one_per_example(monkeypatch):
    monkeypatch.delenv("B2B_CPU_SHARDS", raising=False)
    assert auto_shards(1) == 1
    assert auto_shards(4096) == (runtime.usable_cores() if mx.default_device() == mx.cpu else 1)
    monkeypatch.setenv("B2B_CPU_SHARDS", "3")
    assert auto_shards(8) == (3 if mx.default_device() == mx.cpu else 1)
    monkeypatch.setenv("B2B_CPU_SHARDS", "many")
    assert auto_shards(1) == 1
