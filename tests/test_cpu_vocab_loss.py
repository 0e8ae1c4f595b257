"""b2b's fused vocabulary projection + cross-entropy (cpu_ops.vocab_loss, cpu_vocab_loss.c)
against the logits path it replaces: per-row losses and gradients, with label smoothing and
padding rows, eager and compiled; the summary loss with and without it (loss and every
gradient of a model); where it steps aside; bad labels."""
import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx.utils import tree_flatten

from b2b import B2BConfig, Bert2Bert, cpu_ops
from b2b.fastmath import cross_entropy
from train.losses import seq2seq_loss

needs_kernel = pytest.mark.skipif(not cpu_ops.enabled("vocab_loss"),
                                  reason="b2b's CPU kernels not built here, or no BLAS with cblas_sgemm")


def _inputs(N=37, C=32, V=1003, seed=0):
    rng = np.random.default_rng(seed)
    h = mx.array(rng.standard_normal((N, C)).astype(np.float32))
    W = mx.array(rng.standard_normal((V, C)).astype(np.float32) * 0.3)
    b = mx.array(rng.standard_normal(V).astype(np.float32) * 0.1)
    labels = mx.array(rng.integers(0, V, N).astype(np.int32))
    weights = mx.array((rng.random(N) < 0.7).astype(np.float32))
    cot = mx.array(rng.random(N).astype(np.float32))  # a different weight per row: the backward scales rows
    return h, W, b, labels, weights, cot


def _reference_rows(h, W, b, labels, smoothing):
    logits = h @ W.T + b
    nll, lse = cross_entropy(logits, labels)
    return (1 - smoothing) * nll + smoothing * (lse - logits.mean(axis=-1)) if smoothing else nll


@needs_kernel
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
@pytest.mark.parametrize("compiled", [False, True])
def test_matches_the_logits_path(smoothing, compiled):
    h, W, b, labels, weights, cot = _inputs()

    def fused(h, W, b):
        return (cpu_ops.vocab_loss(h, W, b, labels, weights, smoothing) * cot * weights).sum()

    def plain(h, W, b):
        return (_reference_rows(h, W, b, labels, smoothing) * cot * weights).sum()

    grad = mx.value_and_grad(fused, argnums=(0, 1, 2))
    got = (mx.compile(grad) if compiled else grad)(h, W, b)
    want = mx.value_and_grad(plain, argnums=(0, 1, 2))(h, W, b)
    assert abs(got[0].item() - want[0].item()) <= 1e-5 * abs(want[0].item())
    for g, r in zip(got[1], want[1]):
        assert float(mx.abs(g - r).max()) <= 1e-5 * float(mx.abs(r).max())
    rows = cpu_ops.vocab_loss(h, W, b, labels, weights, smoothing)
    ref = _reference_rows(h, W, b, labels, smoothing)
    scored = np.array(weights) != 0
    assert np.allclose(np.array(rows)[scored], np.array(ref)[scored], rtol=1e-5)
    assert not np.array(rows)[~scored].any()  # unscored rows are not computed


@needs_kernel
def test_no_scored_row_gives_zero_loss_and_gradients():
    h, W, b, labels, _, _ = _inputs(N=5)
    none = mx.zeros((5,))
    loss, grads = mx.value_and_grad(lambda h, W, b: cpu_ops.vocab_loss(h, W, b, labels, none).sum(), argnums=(0, 1, 2))(h, W, b)
    assert loss.item() == 0.0
    assert all(not mx.any(g).item() for g in grads)


@needs_kernel
def test_a_label_outside_the_vocabulary_is_an_error():
    h, W, b, labels, weights, _ = _inputs(N=4, V=50)
    bad = mx.array([1, 2, 50, 3], dtype=mx.int32)
    with pytest.raises(RuntimeError, match="outside the vocabulary"):
        mx.eval(cpu_ops.vocab_loss(h, W, b, bad, mx.ones((4,))))
    # a padding row's label is never read
    mx.eval(cpu_ops.vocab_loss(h, W, b, bad, mx.array([1.0, 1.0, 0.0, 1.0])))


def test_steps_aside_where_it_does_not_apply(monkeypatch):
    h, W, b, labels, weights, _ = _inputs(N=4, V=50)
    assert cpu_ops.vocab_loss(h.astype(mx.float16), W, b, labels, weights) is None
    assert cpu_ops.vocab_loss(h, W[:, :8], b, labels, weights) is None
    assert cpu_ops.vocab_loss(h[None], W, b, labels, weights) is None
    assert cpu_ops.vocab_loss(h, W, b, labels.astype(mx.float32), weights) is None  # labels: integers
    monkeypatch.setenv("B2B_CPU_VOCAB_LOSS", "0")
    assert cpu_ops.vocab_loss(h, W, b, labels, weights) is None
    import b2b

    assert b2b.runtime_info()["cpu_vocab_loss"] is False


@needs_kernel
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_summary_loss_uses_it_and_matches(monkeypatch, smoothing):
    """seq2seq_loss through the kernel gives the logits path's loss, token count and gradients."""
    cfg = B2BConfig(vocab_size=120, hidden_size=64, num_heads=2, encoder_layers=2, decoder_layers=2, ffn_size=128,
                    max_positions=64)
    mx.random.seed(3)
    model = Bert2Bert(cfg)
    model.eval()
    rng = np.random.default_rng(0)
    src = mx.array(rng.integers(5, 120, size=(2, 20)))
    src_mask = mx.ones(src.shape, dtype=mx.int32)
    tgt = rng.integers(5, 120, size=(2, 9))
    tgt[1, 6:] = cfg.pad_id  # padding: not scored
    tgt = mx.array(tgt)
    step = nn.value_and_grad(model, lambda m: seq2seq_loss(m, src, src_mask, tgt, smoothing))
    calls = []
    real = cpu_ops.vocab_loss
    monkeypatch.setattr(cpu_ops, "vocab_loss", lambda *a: calls.append(1) or real(*a))
    (fused, (_, n_fused, _)), g_fused = step(model)
    assert calls
    monkeypatch.setenv("B2B_CPU_VOCAB_LOSS", "0")
    (plain, (_, n_plain, _)), g_plain = step(model)
    assert n_fused.item() == n_plain.item() == 8 + 5
    assert abs(fused.item() - plain.item()) <= 1e-5 * abs(plain.item())
    for (name, g), (_, r) in zip(tree_flatten(g_fused), tree_flatten(g_plain)):
        assert float(mx.abs(g - r).max()) <= 1e-4 * float(mx.abs(r).max()) + 1e-8, name


@needs_kernel
def test_more_rows_after_fewer():
    """The backward's per-thread buffer grows: a bigger batch after a small one is still right."""
    for N in (5, 64, 9):
        h, W, b, labels, weights, cot = _inputs(N=N, seed=N)
        got = mx.grad(lambda h: (cpu_ops.vocab_loss(h, W, b, labels, weights) * cot).sum())(h)
        want = mx.grad(lambda h: (_reference_rows(h, W, b, labels, 0.0) * cot * weights).sum())(h)
        assert float(mx.abs(got - want).max()) <= 1e-5 * float(mx.abs(want).max())
