"""Losses. Logits are computed only where a prediction is scored: on a CPU, MLX's exp is
scalar and the vocabulary softmax dominates a step (the summary loss: b2b's fused kernel,
cpu_ops.vocab_loss, where it applies)."""
from __future__ import annotations

import mlx.core as mx

from b2b import Bert2Bert, cpu_ops
from b2b.fastmath import cross_entropy as _nll_and_lse
from b2b.pointer import label_nll


def cross_entropy(logits: mx.array, labels: mx.array, weights: mx.array, label_smoothing: float = 0.0) -> tuple[mx.array, mx.array]:
    """Weighted mean token cross-entropy (logits (N, V), labels (N,), weights (N,)) and the
    number of scored tokens. One logsumexp per row: the only pass of exps over the vocabulary."""
    nll = _smoothed_nll(logits.astype(mx.float32), labels, label_smoothing)
    n = weights.sum()
    return (nll * weights).sum() / mx.maximum(n, 1.0), n


def _smoothed_nll(logits: mx.array, labels: mx.array, label_smoothing: float) -> mx.array:
    """Per-row cross-entropy (N,) of float32 logits (N, V), label-smoothed."""
    nll, lse = _nll_and_lse(logits, labels)  # (N,) each
    if label_smoothing > 0:
        nll = (1 - label_smoothing) * nll + label_smoothing * (lse - logits.mean(axis=-1))
    return nll


def mlm_loss(
    model: Bert2Bert,
    inputs: mx.array,
    attention_mask: mx.array,
    positions: mx.array,
    labels: mx.array,
    weights: mx.array,
    token_type_ids: mx.array | None = None,
    nsp_labels: mx.array | None = None,
) -> tuple[mx.array, tuple[mx.array, ...]]:
    """MLM loss on gathered positions (+ NSP loss when labels are given). Returns
    (loss, (mlm_loss, scored tokens, correct predictions, nsp_loss, nsp_correct))."""
    h = model.encoder(inputs, attention_mask, token_type_ids)  # (B, T, C)
    picked = mx.take_along_axis(h, positions[..., None], axis=1)  # (B, P, C)
    logits = model.encoder.mlm_logits(picked.reshape(-1, h.shape[-1]))  # (B*P, V)
    flat_labels, flat_w = labels.reshape(-1), weights.reshape(-1)
    loss, n = cross_entropy(logits, flat_labels, flat_w)
    correct = ((mx.argmax(logits, axis=-1) == flat_labels) * flat_w).sum()
    nsp_loss = nsp_correct = mx.array(0.0)
    total = loss
    if nsp_labels is not None:
        nsp_logits = model.encoder.nsp_logits(h)  # (B, 2)
        nsp_loss, _ = cross_entropy(nsp_logits, nsp_labels, mx.ones(nsp_labels.shape))
        nsp_correct = (mx.argmax(nsp_logits, axis=-1) == nsp_labels).sum()
        total = loss + nsp_loss
    return total, (loss, n, correct, nsp_loss, nsp_correct)


def seq2seq_loss(
    model: Bert2Bert,
    src: mx.array,
    src_mask: mx.array,
    tgt: mx.array,
    label_smoothing: float = 0.0,
    coverage: float = 0.0,
) -> tuple[mx.array, tuple[mx.array, ...]]:
    """Teacher-forced summary loss: decoder input tgt[:, :-1], labels tgt[:, 1:], padding
    ignored. Returns (loss, (token NLL, scored tokens, coverage loss)); the loss is the NLL plus
    `coverage` x the coverage loss (formed for pointer models with `coverage` > 0, else 0). A
    scored label outside the vocabulary is an error on the CPU (the fused kernel checks; the
    logits path would read past the row)."""
    return _teacher_forced(model, model.encode(src, src_mask), src, src_mask, tgt, label_smoothing, coverage)


def _teacher_forced(
    model: Bert2Bert, memory: mx.array, src: mx.array, src_mask: mx.array, tgt: mx.array,
    label_smoothing: float, coverage: float,
) -> tuple[mx.array, tuple[mx.array, ...]]:
    """seq2seq_loss on encoder states `memory` (B, S, C) already computed."""
    rows, weights, copy_weights = label_rows(model, memory, src, src_mask, tgt, label_smoothing)
    n = weights.sum()
    covered = mx.array(0.0)  # formed only when it is trained: not in every pointer model's step
    if coverage and copy_weights is not None:
        covered = (coverage_rows(copy_weights) * weights).sum() / mx.maximum(n, 1.0)
    nll = (rows * weights).sum() / mx.maximum(n, 1.0)
    return nll + coverage * covered, (nll, n, covered)


def label_rows(
    model: Bert2Bert, memory: mx.array, src: mx.array, src_mask: mx.array, tgt: mx.array, label_smoothing: float = 0.0
) -> tuple[mx.array, mx.array, mx.array | None]:
    """-log p of each label of `tgt` (B, T) teacher-forced on `memory` (B, S, C): (rows (B, T-1),
    weights (B, T-1) 1 where the label is not padding, the pointer's copy weights (B, T-1, S) or
    None without a pointer)."""
    dec_in, labels = tgt[:, :-1], tgt[:, 1:]
    weights = (labels != model.config.pad_id).astype(mx.float32)
    h3 = model.decode(dec_in, memory, src_mask)  # (B, T, C)
    h, flat_labels = h3.reshape(-1, h3.shape[-1]), labels.reshape(-1)  # (B*T, C), (B*T,)
    # On the CPU, b2b's fused kernel computes the loss without the (B*T, V) logits in memory
    # and skips padding; elsewhere (or without it) the logits are formed.
    features, matrix, bias = model.lm_projection(h)
    rows = cpu_ops.vocab_loss(features, matrix, bias, flat_labels, weights.reshape(-1), label_smoothing)
    if rows is None:
        rows = _logits_nll(model, h, flat_labels, label_smoothing)
    rows = rows.reshape(labels.shape)
    if "pointer" not in model:
        return rows, weights, None
    # The label's probability mixes the vocabulary's with its copy mass in the source
    # (label smoothing, if any, stays on the vocabulary part).
    copy_weights, gate = model.point(h3, memory, src)
    return label_nll(rows, copy_weights, gate, src, labels), weights, copy_weights


def reinforce_loss(
    model: Bert2Bert,
    src: mx.array,
    src_mask: mx.array,
    tgt: mx.array,
    samples: mx.array,
    advantages: mx.array,
    rl_weight: float,
    label_smoothing: float = 0.0,
    coverage: float = 0.0,
) -> tuple[mx.array, tuple[mx.array, ...]]:
    """The summary loss mixed with REINFORCE on summaries the model sampled itself:
    (1 - rl_weight) x seq2seq_loss + rl_weight x -sum_k A_k log p(sample_k) / sampled tokens.
    `samples` (B, K, T): K sampled summaries of each article, [CLS] ... [SEP] padded;
    `advantages` (B, K): each sample's reward less its baseline (0 for a sample not to learn
    from). The encoder runs once per article. Returns (loss, (token NLL, scored tokens,
    coverage loss, REINFORCE loss))."""
    memory = model.encode(src, src_mask)  # (B, S, C)
    ml, (nll, n, covered) = _teacher_forced(model, memory, src, src_mask, tgt, label_smoothing, coverage)
    B, K, T = samples.shape
    per_sample = lambda a: mx.repeat(a, K, axis=0)  # noqa: E731  (B, ...) -> (B*K, ...), article b's rows together
    rows, weights, _ = label_rows(model, per_sample(memory), per_sample(src), per_sample(src_mask), samples.reshape(B * K, T))
    log_p = -(rows * weights).sum(axis=1)  # (B*K,) each sample's log-probability
    rl = -(advantages.reshape(-1) * log_p).sum() / mx.maximum(weights.sum(), 1.0)
    return (1 - rl_weight) * ml + rl_weight * rl, (nll, n, covered, rl)


def coverage_rows(copy_weights: mx.array) -> mx.array:
    """See et al.'s coverage loss per target step (B, T) from copy weights (B, T, S):
    sum_i min(a_t[i], c_t[i]), where the coverage c_t = a_1 + ... + a_{t-1} is the attention
    the pointer already gave each source position. It is 0 while the pointer attends to
    new positions and grows when it returns to one: repeated copying costs, new copying
    does not. (Here it is a loss only; the attention does not see c_t, so decoding is
    unchanged.)"""
    copy_weights = copy_weights.astype(mx.float32)
    cover = mx.cumsum(copy_weights, axis=1) - copy_weights  # (B, T, S): before step t
    return mx.minimum(copy_weights, cover).sum(axis=-1)


def _logits_nll(model: Bert2Bert, h: mx.array, labels: mx.array, label_smoothing: float) -> mx.array:
    """Per-row (label-smoothed) cross-entropy (N,) through the (N, V) logits."""
    return _smoothed_nll(model.lm_logits(h).astype(mx.float32), labels, label_smoothing)
