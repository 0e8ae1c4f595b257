"""Tests for train/losses.py: both losses can overfit one batch on the tiny model."""
from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np

from train.losses import cross_entropy, mlm_loss, seq2seq_loss
from train.masking import mask_tokens


def overfit(model, loss_fn, arrays, steps: int = 40, lr: float = 3e-3) -> list[float]:
    """Adam on one batch; the loss after each step."""
    optimizer = optim.Adam(learning_rate=lr)
    loss_and_grad = nn.value_and_grad(model, loss_fn)
    losses = []
    for _ in range(steps):
        (loss, _), grads = loss_and_grad(model, *arrays)
        optimizer.update(model, grads)
        mx.eval(model.parameters(), optimizer.state, loss)
        losses.append(loss.item())
    return losses


def test_cross_entropy_matches_numpy_and_ignores_weighted_out_rows():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(5, 7)).astype(np.float32)
    labels = np.array([1, 2, 3, 4, 5], np.int32)
    weights = np.array([1, 1, 1, 0, 0], np.float32)
    loss, n = cross_entropy(mx.array(logits), mx.array(labels), mx.array(weights))
    logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    expected = -logp[np.arange(3), labels[:3]].mean()
    assert n.item() == 3
    assert np.isclose(loss.item(), expected, rtol=1e-5)


def test_mlm_loss_falls_when_overfitting_one_batch(tiny_model, tokenizer, cnndm_rows):
    texts = [r["article"][:400] for r in cnndm_rows[:4]]
    enc = tokenizer.encode_plain(texts)
    T = 48
    ids = np.zeros((4, T), np.int32)
    for row, x in zip(ids, enc):
        body = x[: T - 2]
        row[0], row[1 : len(body) + 1], row[len(body) + 1] = tokenizer.cls_id, body, tokenizer.sep_id
    specials = {tokenizer.pad_id, tokenizer.cls_id, tokenizer.sep_id, tokenizer.mask_id, tokenizer.unk_id}
    m = mask_tokens(ids, np.random.default_rng(0), specials, tokenizer.vocab_size, tokenizer.mask_id)
    arrays = [mx.array(a) for a in (m.inputs, (ids != 0).astype(np.int32), m.positions, m.labels, m.weights)]
    losses = overfit(tiny_model, mlm_loss, arrays)
    assert np.isfinite(losses).all()
    assert losses[-1] < 0.5 * losses[0], losses


def summary_batch(tokenizer, rows, src_width: int = 48, tgt_width: int = 17):
    """(src, src mask, tgt) int32 numpy arrays of CNN/DM rows: [CLS] ... [SEP], zero-padded."""

    def padded(texts, width):
        out = np.zeros((len(texts), width), np.int32)
        for row, x in zip(out, tokenizer.encode_plain(texts)):
            body = x[: width - 2]
            row[0], row[1 : len(body) + 1], row[len(body) + 1] = tokenizer.cls_id, body, tokenizer.sep_id
        return out

    src = padded([r["article"][:400] for r in rows], src_width)
    return src, (src != 0).astype(np.int32), padded([r["highlights"] for r in rows], tgt_width)


def test_seq2seq_loss_falls_when_overfitting_one_batch(tiny_model, tokenizer, cnndm_rows):
    src, mask, tgt = summary_batch(tokenizer, cnndm_rows[:4])
    arrays = [mx.array(src), mx.array(mask), mx.array(tgt)]
    losses = overfit(tiny_model, seq2seq_loss, arrays)
    assert np.isfinite(losses).all()
    assert losses[-1] < 0.5 * losses[0], losses
    # Padding is not scored: the reported token count is the real labels of tgt[:, 1:].
    _, (_, n, _) = seq2seq_loss(tiny_model, *arrays)
    assert n.item() == int((tgt[:, 1:] != 0).sum())
