"""The pointer-generator (b2b/pointer.py): a proper distribution, a training loss that is its
negative log-likelihood, decoding steps (C, compiled MLX, plain MLX) that give the teacher-forced
distribution, copying that reaches the summary, and warm starts and checkpoints that keep it."""
import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

from b2b import Bert2Bert, DecodingConfig, generate, load_checkpoint, save_checkpoint
from b2b.convert import ConversionError, to_hf_encoder_decoder
from b2b.generate import _encode, _Stepper
from b2b.pointer import copyable, label_nll


def _pointer_model(tiny_config, share: bool = False, seed: int = 0, copy_bias: float | None = None) -> Bert2Bert:
    mx.random.seed(seed)
    model = Bert2Bert(tiny_config.replace(share_encoder_decoder=share, pointer_generator=True))
    # A gate that depends on the state, and copy scores that are not flat: random, not the warm start.
    model.pointer.gate.weight = mx.random.normal(model.pointer.gate.weight.shape) * 0.3
    model.pointer.gate.bias = mx.array([0.0 if copy_bias is None else copy_bias])
    model.pointer.query.weight = mx.random.normal(model.pointer.query.weight.shape) * 0.5
    model.eval()
    return model


def _batch():
    # Rare ids in the source (2000-2010) that the targets repeat; a padded row.
    src = mx.array([[101, 2000, 2001, 2002, 2003, 102, 0, 0, 0], [101, 2004, 2005, 2006, 2007, 2008, 2009, 2010, 102]])
    tgt = mx.array([[101, 2002, 2003, 1996, 2000, 102], [101, 2010, 1996, 2004, 2005, 102]])
    return src, (src > 0).astype(mx.int32), tgt


def test_mixture_is_a_distribution_that_copies(tiny_config):
    model = _pointer_model(tiny_config)
    src, mask, tgt = _batch()
    lp = model.log_probs(src, mask, tgt)  # (B, T, V)
    assert np.allclose(np.array(mx.logsumexp(lp, axis=-1)), 0.0, atol=1e-4)
    vocab = model.lm_logits(model.decode(tgt, model.encode(src, mask), mask))
    vocab_lp = np.array(nn.log_softmax(vocab.astype(mx.float32), axis=-1))
    got = np.array(lp)
    # Source tokens gain probability from copying; [SEP], never copyable, and other tokens lose
    # the gate's share.
    assert (got[1, :, 2010] > vocab_lp[1, :, 2010]).all()
    assert (got[:, :, 102] < vocab_lp[:, :, 102]).all() and (got[:, :, 1996] < vocab_lp[:, :, 1996]).all()
    # Padding, [CLS] and [SEP] are never copy targets.
    assert np.array(copyable(src, model.config)).tolist()[0] == [False, True, True, True, True, False, False, False, False]


@pytest.mark.parametrize("fused", ["1", "0"])
def test_training_loss_is_the_mixture_nll(tiny_config, fused, monkeypatch):
    from train.losses import seq2seq_loss

    monkeypatch.setenv("B2B_CPU_VOCAB_LOSS", fused)
    model = _pointer_model(tiny_config, seed=1)
    src, mask, tgt = _batch()
    loss, (_, n, _) = seq2seq_loss(model, src, mask, tgt)
    lp = np.array(model.log_probs(src, mask, tgt[:, :-1]))
    labels = np.array(tgt[:, 1:])
    picked = np.take_along_axis(lp, labels[..., None], axis=-1)[..., 0]
    want = -(picked * (labels != 0)).sum() / (labels != 0).sum()
    assert float(n) == (labels != 0).sum()
    assert abs(float(loss) - want) < 1e-4


def test_label_nll_without_copy_mass_is_the_vocab_share():
    vocab_nll = mx.array([[2.0]])
    weights = mx.array([[[0.5, 0.5]]])
    gate = mx.array([[0.3]])
    out = label_nll(vocab_nll, weights, gate, mx.array([[7, 8]]), mx.array([[9]]))
    # The label is not in the source: only the vocabulary's share of its probability is left.
    assert abs(float(out[0, 0]) - (2.0 - float(nn.log_sigmoid(gate)[0, 0]))) < 1e-5
    # In the source at both positions: the copy share adds all of the weight.
    both = label_nll(vocab_nll, weights, gate, mx.array([[9, 9]]), mx.array([[9]]))
    want = -np.logaddexp(float(nn.log_sigmoid(gate)[0, 0]) - 2.0, float(nn.log_sigmoid(-gate)[0, 0]))
    assert abs(float(both[0, 0]) - want) < 1e-5


def test_coverage_loss_charges_returning_attention_only():
    from train.losses import coverage_rows

    # Steps attending to new positions cost nothing; returning to position 0 costs what it
    # gives there, up to what position 0 already had.
    fresh = mx.array([[[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]]])
    assert np.allclose(np.array(coverage_rows(fresh)), 0.0)
    back = mx.array([[[0.6, 0.4, 0.0], [0.0, 0.5, 0.5], [0.9, 0.1, 0.0]]])
    # step 2: min(0.5, 0.4) at position 1; step 3: min(0.9, 0.6) + min(0.1, 0.9).
    assert np.allclose(np.array(coverage_rows(back)), [[0.0, 0.4, 0.7]])


def test_coverage_weight_adds_the_coverage_loss_and_trains_the_pointer(tiny_config):
    from train.losses import seq2seq_loss

    model = _pointer_model(tiny_config, seed=1)
    src, mask, tgt = _batch()
    plain, (nll, _, covered) = seq2seq_loss(model, src, mask, tgt)
    both, (nll2, _, covered2) = seq2seq_loss(model, src, mask, tgt, coverage=0.5)
    assert float(covered) == 0 and abs(float(plain) - float(nll)) < 1e-6  # not formed when not trained
    assert float(covered2) > 0
    assert abs(float(both) - (float(nll2) + 0.5 * float(covered2))) < 1e-5
    only_coverage = lambda m, *a: seq2seq_loss(m, *a, coverage=1.0)[0] - seq2seq_loss(m, *a)[0]  # noqa: E731
    _, grads = nn.value_and_grad(model, only_coverage)(model, src, mask, tgt)
    assert np.abs(np.array(grads["pointer"]["query"]["weight"])).max() > 0


def test_gradients_reach_the_pointer(tiny_config):
    from train.losses import seq2seq_loss

    model = _pointer_model(tiny_config)
    model.train()
    src, mask, tgt = _batch()
    _, grads = nn.value_and_grad(model, lambda m, *a: seq2seq_loss(m, *a)[0])(model, src, mask, tgt)
    for name in ("query", "key", "gate"):
        g = np.array(grads["pointer"][name]["weight"])
        assert np.isfinite(g).all() and np.abs(g).max() > 0, name


@pytest.mark.parametrize("path", ["c", "compiled", "plain"])
@pytest.mark.parametrize("beams", [1, 2])
def test_decoding_steps_give_the_teacher_forced_mixture(tiny_config, path, beams, monkeypatch):
    from b2b import cpu_step

    if path == "c" and not cpu_step.available():
        pytest.skip("the C step needs MLX on the CPU and a C compiler with OpenMP")
    monkeypatch.setenv("B2B_CPU_STEP", "1" if path == "c" else "0")
    monkeypatch.setenv("B2B_COMPILE_DECODE", "0" if path == "plain" else "1")
    model = _pointer_model(tiny_config, share=beams == 2)
    src, mask, tgt = _batch()
    want = np.array(model.log_probs(src, mask, tgt))  # (B, T, V)
    memory, src_mask, ids = _encode(model, src, mask)
    stepper = _Stepper(model, memory, src_mask, 16, beams=beams, src_ids=ids)
    assert (stepper.in_c is not None) == (path == "c")
    for t in range(tgt.shape[1]):
        rows = mx.repeat(tgt[:, t : t + 1], beams, axis=0)  # (B * beams, 1)
        got = stepper(rows)
        assert np.allclose(got, np.repeat(want[:, t], beams, axis=0), atol=2e-4), t


def _coverage_case(tiny_config, ends: str):
    """A pointer model that copies a lot (its copy attention comes back to positions) and its
    decoding settings: hypotheses that run to max_length, or ("eos") ones that can end earlier."""
    if ends == "length":
        return _pointer_model(tiny_config, copy_bias=-3.0), dict(max_length=7)
    model = _pointer_model(tiny_config, copy_bias=-1.0)
    model.decoder.lm_head.bias = model.decoder.lm_head.bias.at[tiny_config.sep_id].add(8.0)  # [SEP] likely
    return model, dict(max_length=12, min_length=5, early_stopping=False)


@pytest.mark.parametrize("path", ["c", "plain"])
@pytest.mark.parametrize("beta", [0.0, 2.0])
@pytest.mark.parametrize("ends", ["length", "eos"])
def test_beam_scores_charge_the_coverage_penalty(tiny_config, path, beta, ends, monkeypatch):
    """A hypothesis's score is its log-probability, length-normalised, minus beta times the copy
    attention its steps spent past 1 on each source position (recomputed here by teacher forcing);
    beta 0 charges nothing."""
    from b2b import cpu_step

    if path == "c" and not cpu_step.available():
        pytest.skip("the C step needs MLX on the CPU and a C compiler with OpenMP")
    monkeypatch.setenv("B2B_CPU_STEP", "1" if path == "c" else "0")
    monkeypatch.setenv("B2B_COMPILE_DECODE", "0" if path == "plain" else "1")
    model, settings = _coverage_case(tiny_config, ends)
    src, mask, _ = _batch()
    lp = 0.7
    cfg = DecodingConfig(num_beams=3, length_penalty=lp, no_repeat_ngram_size=0, coverage_penalty=beta, **settings)
    hyps = generate(model, src, mask, cfg)
    assert ends in [h.finish_reason for h in hyps]  # the case reaches the score formula it is named for
    memory, src_mask, ids = _encode(model, src, mask)
    over = []
    for b, h in enumerate(hyps):
        steps = [101] + h.tokens + ([102] if h.finish_reason == "eos" else [])
        stepper = _Stepper(model, memory[b : b + 1], None if src_mask is None else src_mask[b : b + 1], 16,
                           log_probs=True, src_ids=ids[b : b + 1], copy_weights=True)
        logp, coverage = 0.0, 0.0
        for t in range(len(steps) - 1):
            logp += float(stepper(mx.array([[steps[t]]]))[0, steps[t + 1]])
            coverage = coverage + stepper.copy.weights[0].astype(np.float64)
        over.append(np.maximum(coverage - 1.0, 0.0).sum())
        assert h.score == pytest.approx(logp / (len(steps) - 1) ** lp - beta * over[-1], abs=1e-3), b
    assert max(over) > 0  # the hypotheses did go back to positions: a penalty had something to charge


def test_the_coverage_penalty_steers_the_search(tiny_config):
    """Charged while ranking (not only on the final scores): it changes which beam survives, and
    the streamed best beam is the one the final pick takes."""
    from b2b.generate import decode_stream

    model, settings = _coverage_case(tiny_config, "length")
    src, mask, _ = _batch()
    run = lambda beta: generate(model, src, mask, DecodingConfig(  # noqa: E731
        num_beams=3, no_repeat_ngram_size=0, coverage_penalty=beta, **settings))
    free, charged = run(0.0), run(2.0)
    assert [h.tokens for h in free] != [h.tokens for h in charged]
    cfg = DecodingConfig(num_beams=3, no_repeat_ngram_size=0, coverage_penalty=2.0, **settings)
    *steps, final = list(decode_stream(model, src, mask, cfg))
    assert steps[-1].tokens == [h.tokens for h in final]


def test_a_copying_gate_writes_only_source_tokens(tiny_config, tokenizer):
    from b2b import summarize

    model = _pointer_model(tiny_config, copy_bias=-30.0)  # the vocabulary gets e^-30 of the mass
    article = "Zebras graze quietly near the river while tourists photograph them."
    source = set(tokenizer.batch_encode([article]).ids[0].tolist())
    for beams in (1, 3):
        result = summarize(model, tokenizer, article, num_beams=beams, max_length=12, no_repeat_ngram_size=0,
                           no_repeat_word=False)
        assert result.token_ids and set(result.token_ids) <= source - {101, 102}, result.text
        assert result.finish_reason == "length"  # [SEP] is never copied


def test_sampling_with_a_pointer(tiny_config):
    model = _pointer_model(tiny_config)
    src, mask, _ = _batch()
    cfg = DecodingConfig(do_sample=True, max_length=6, seed=3, top_k=5)
    a = generate(model, src, mask, cfg)
    b = generate(model, src, mask, cfg)
    assert [h.tokens for h in a] == [h.tokens for h in b] and all(h.tokens for h in a)


def test_checkpoint_keeps_the_pointer_and_old_configs_have_none(tiny_config, tokenizer, tmp_path):
    model = _pointer_model(tiny_config)
    save_checkpoint(model, tokenizer, str(tmp_path / "p"))
    loaded, _ = load_checkpoint(str(tmp_path / "p"))
    assert loaded.config.pointer_generator
    assert np.array_equal(np.array(loaded.pointer.gate.weight), np.array(model.pointer.gate.weight))
    src, mask, tgt = _batch()
    assert np.allclose(np.array(loaded.log_probs(src, mask, tgt)), np.array(model.log_probs(src, mask, tgt)), atol=1e-5)
    assert "pointer" not in Bert2Bert(tiny_config)
    with pytest.raises(ConversionError, match="pointer"):
        to_hf_encoder_decoder(model)


def test_finetune_adds_a_pointer_warm_started_from_cross_attention(tiny_config, tokenizer, tmp_path):
    from train.finetune import FinetuneSettings
    from train.init import build_model

    mx.random.seed(5)
    plain = Bert2Bert(tiny_config)
    save_checkpoint(plain, tokenizer, str(tmp_path / "plain"))
    s = FinetuneSettings(init=str(tmp_path / "plain"), out=str(tmp_path / "run"))
    model, _ = build_model(s, pointer=True)
    assert model.config.pointer_generator
    last = plain.decoder.layers[-1].cross_attn
    assert np.array_equal(np.array(model.pointer.query.weight), np.array(last.query.weight))
    assert np.array_equal(np.array(model.pointer.key.bias), np.array(last.key.bias))
    assert float(model.pointer.gate.bias[0]) == 2.0 and float(mx.abs(model.pointer.gate.weight).max()) == 0.0
    # The rest is the checkpoint's.
    assert np.array_equal(np.array(model.encoder.embeddings.word.weight), np.array(plain.encoder.embeddings.word.weight))


def test_c_mixing_equals_numpy_mixing(tiny_config):
    from b2b import cpu_step
    from b2b.pointer import CopyMixer

    if not cpu_step.available():
        pytest.skip("the C step needs MLX on the CPU and a C compiler with OpenMP")
    model = _pointer_model(tiny_config, seed=4)
    # The second input holds nothing to copy: its rows keep the vocabulary's distribution.
    src = mx.array([[101, 2000, 2001, 2000, 2003, 102, 0], [101, 102, 0, 0, 0, 0, 0]])
    memory = model.encode(src, (src > 0).astype(mx.int32))
    mixer = CopyMixer(model, memory, src, beams=3, keep_weights=True)
    rng = np.random.default_rng(0)
    vocab = rng.normal(size=(6, tiny_config.vocab_size)).astype(np.float32)
    vocab -= np.log(np.exp(vocab).sum(-1, keepdims=True))
    h = rng.normal(size=(6, tiny_config.hidden_size)).astype(np.float32)
    in_c = mixer(vocab.copy(), h)
    weights_c = mixer.weights.copy()
    in_numpy = vocab.copy()
    mixer._mix_numpy(in_numpy, h)
    assert np.allclose(in_c, in_numpy, atol=1e-4)
    # The copy weights kept for the coverage penalty: a distribution over copyable positions
    # (none for the input with nothing to copy), the same in C and NumPy.
    assert np.allclose(weights_c, mixer.weights, atol=1e-5)
    assert np.allclose(weights_c[:3].sum(-1), 1.0, atol=1e-5) and (weights_c[:3, [0, 5, 6]] == 0).all()
    assert (weights_c[3:] == 0).all()
    assert np.allclose(np.log(np.exp(in_c.astype(np.float64)).sum(-1)), 0.0, atol=1e-4)
    assert (in_c[:3, 2000] > vocab[:3, 2000]).all() and (in_c[:3, 1996] < vocab[:3, 1996]).all()
    assert np.allclose(in_c[3:], vocab[3:], atol=1e-6)


def test_finetune_command_trains_a_pointer_and_resumes_it(tmp_path):
    from conftest import FIXTURES
    from train import finetune

    args = ["--preset", "tiny", "--max-source-len", "64", "--max-target-len", "24", "--batch-size", "4",
            "--rouge-examples", "0", "--val-examples", "8", "--warmup-steps", "0", "--eval-every", "0",
            "--data", str(FIXTURES / "cnndm_tok_sample.jsonl.gz"), "--limit", "20", "--out", str(tmp_path / "run")]
    assert finetune.main(args + ["--pointer-generator", "--max-steps", "2"]) == 0
    saved = tmp_path / "run" / "checkpoints" / "step_0000002"
    model, _ = load_checkpoint(str(saved))
    assert model.config.pointer_generator
    assert model.trained_source_length == 64  # the checkpoint's decoding.json: decoding reads as much
    assert finetune.main(args + ["--resume", "--max-steps", "3"]) == 0  # the saved settings keep the pointer
    resumed, _ = load_checkpoint(str(tmp_path / "run" / "checkpoints" / "step_0000003"))
    assert resumed.config.pointer_generator and resumed.trained_source_length == 64
