"""REINFORCE on sampled summaries (`train.finetune --rl-weight`, train/sampled.py and
train/losses.py's reinforce_loss)."""
from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np
import pytest

from train import finetune
from train.finetune import FinetuneSettings
from train.losses import label_rows, reinforce_loss, seq2seq_loss
from train.sampled import Sampler, leave_one_out, standardize
from train.writer import read_metrics

from test_train_loop import ARGS
from test_train_losses import summary_batch


def test_leave_one_out_baseline_is_the_mean_of_the_other_samples():
    rewards = np.array([[0.1, 0.3, 0.5], [0.2, 0.2, 0.2]], np.float32)
    adv = leave_one_out(rewards)
    assert np.allclose(adv[0], [0.1 - 0.4, 0.3 - 0.3, 0.5 - 0.2], atol=1e-6)
    assert np.allclose(adv[1], 0.0, atol=1e-6)  # samples that tie teach nothing
    assert np.allclose(standardize(adv).std(), 1.0)
    assert np.array_equal(standardize(np.zeros((2, 2), np.float32)), np.zeros((2, 2)))  # no division by 0


def test_with_zero_advantages_the_loss_is_the_token_loss_scaled(tiny_model, tokenizer, cnndm_rows):
    src, mask, tgt = (mx.array(a) for a in summary_batch(tokenizer, cnndm_rows[:3]))
    samples = mx.stack([tgt, tgt], axis=1)  # (B, K=2, T)
    loss, aux = reinforce_loss(tiny_model, src, mask, tgt, samples, mx.zeros((3, 2)), 0.3)
    ml, (nll, n, _) = seq2seq_loss(tiny_model, src, mask, tgt)
    assert np.isclose(loss.item(), 0.7 * ml.item(), rtol=1e-5)
    assert np.isclose(aux[0].item(), nll.item(), rtol=1e-5) and aux[1].item() == n.item()
    assert aux[3].item() == 0.0


def test_a_positive_advantage_makes_its_sample_more_likely_and_a_negative_one_less(tiny_model, tokenizer, cnndm_rows):
    """Pure REINFORCE (--rl-weight 1): Adam steps raise the log-probability of the sample with
    advantage +1 and lower that of its sibling with -1."""
    src, mask, tgt = (mx.array(a) for a in summary_batch(tokenizer, cnndm_rows[:2]))
    other = mx.array(summary_batch(tokenizer, cnndm_rows[2:4])[2])
    samples = mx.stack([tgt, other], axis=1)  # sample 0: the reference, sample 1: another article's
    advantages = mx.array([[1.0, -1.0], [1.0, -1.0]])

    def log_p(seqs):
        rows, weights, _ = label_rows(tiny_model, tiny_model.encode(src, mask), src, mask, seqs)
        return (-(rows * weights).sum(axis=1)).tolist()

    before = [log_p(tgt), log_p(other)]
    optimizer = optim.Adam(learning_rate=3e-3)
    step = nn.value_and_grad(tiny_model, lambda m: reinforce_loss(m, src, mask, tgt, samples, advantages, 1.0)[0])
    for _ in range(10):
        _, grads = step(tiny_model)
        optimizer.update(tiny_model, grads)
        mx.eval(tiny_model.parameters(), optimizer.state)
    after = [log_p(tgt), log_p(other)]
    assert all(a > b for a, b in zip(after[0], before[0])), (before, after)
    assert all(a < b for a, b in zip(after[1], before[1])), (before, after)


def test_sampler_draws_k_summaries_per_article_and_rewards_them_by_rouge(tiny_model, tokenizer, cnndm_rows):
    src, mask, _ = summary_batch(tokenizer, cnndm_rows[:3])
    refs = [r["highlights"] for r in cnndm_rows[:3]]
    drawn = Sampler(tokenizer, 3, 1.0, 12)(tiny_model, src, mask, refs, seed=5)
    B, K, T = drawn.samples.shape
    assert (B, K) == (3, 3) and drawn.advantages.shape == drawn.rewards.shape == (3, 3)
    assert (T - 1) % 16 == 0 and T - 1 >= 14  # [CLS] + up to 12 tokens + [SEP], padded, + the label shift column
    assert (drawn.samples[:, :, 0] == tokenizer.cls_id).all()
    assert ((drawn.rewards >= 0) & (drawn.rewards <= 1)).all()
    assert np.allclose(drawn.advantages.sum(axis=1), 0.0, atol=1e-5)  # leave-one-out advantages are centred per article
    again = Sampler(tokenizer, 3, 1.0, 12)(tiny_model, src, mask, refs, seed=5)
    assert np.array_equal(again.samples, drawn.samples)  # seeded: a resumed run draws the same


def test_sampler_needs_two_samples(tokenizer):
    with pytest.raises(ValueError, match="at least 2 samples"):
        Sampler(tokenizer, 1, 1.0, 12)


@pytest.mark.parametrize("settings, message", [
    (dict(rl_weight=1.5), "--rl-weight must be in"),
    (dict(rl_weight=0.5, rl_samples=1), "--rl-samples must be at least 2"),
    (dict(rl_weight=0.5, rl_temperature=0.0), "--rl-temperature positive"),
])
def test_bad_reinforce_settings_are_one_sentence(settings, message):
    with pytest.raises(ValueError, match=message):
        FinetuneSettings(**settings).validate()


def test_finetune_with_rl_weight_trains_and_logs_the_reward(tmp_path):
    out = tmp_path / "run"
    flags = ["--out", str(out), "--max-steps", "3", "--eval-every", "0", "--rl-weight", "0.5", "--rl-samples", "2"]
    assert finetune.main(ARGS + flags) == 0
    metrics = read_metrics(str(out))
    assert [s for s, _ in metrics["train/reward"]] == [1, 2, 3]
    assert all(0 <= v <= 1 for _, v in metrics["train/reward"])
    assert all(np.isfinite(v) for _, v in metrics["train/rl_loss"] + metrics["train/loss"])
