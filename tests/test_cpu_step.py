"""The C decoding step (b2b/cpu_step.c) against the MLX step it replaces: same logits, same
cache handling for beams, same summaries, and it steps aside where it does not apply."""
import mlx.core as mx
import numpy as np
import pytest

from b2b import Bert2Bert, DecodingConfig, cpu_step, generate
from b2b.generate import _encode, _Stepper

pytestmark = pytest.mark.skipif(not cpu_step.available(), reason="the C step needs MLX on the CPU and a C compiler with OpenMP")


def _model(tiny_config, share: bool, seed: int = 0) -> Bert2Bert:
    mx.random.seed(seed)
    model = Bert2Bert(tiny_config.replace(share_encoder_decoder=share))
    model.eval()
    return model


def _src():
    # Two inputs of different lengths: the padding mask matters in cross-attention.
    src = mx.array([[101, 2000, 2001, 2002, 2003, 102, 0, 0, 0], [101, 2004, 2005, 2006, 2007, 2008, 2009, 2010, 102]])
    return src, (src > 0).astype(mx.int32)


def _steppers(model, beams, log_probs, monkeypatch):
    src, mask = _src()
    memory, src_mask = _encode(model, src, mask)
    monkeypatch.setenv("B2B_CPU_STEP", "0")
    in_mlx = _Stepper(model, memory, src_mask, 20, beams=beams, log_probs=log_probs)
    monkeypatch.setenv("B2B_CPU_STEP", "1")
    in_c = _Stepper(model, memory, src_mask, 20, beams=beams, log_probs=log_probs)
    assert in_mlx.in_c is None and in_c.in_c is not None
    return in_mlx, in_c


@pytest.mark.parametrize("share", [False, True])
@pytest.mark.parametrize("beams", [1, 3])
def test_c_step_gives_the_mlx_step_logits(tiny_config, share, beams, monkeypatch):
    model = _model(tiny_config, share)
    in_mlx, in_c = _steppers(model, beams, log_probs=beams > 1, monkeypatch=monkeypatch)
    rng = np.random.default_rng(beams)
    R = 2 * beams
    tokens = mx.full((R, 1), 101, dtype=mx.int32)
    reorder = None
    for step in range(12):
        want, got = np.array(in_mlx(tokens, reorder)), np.array(in_c(tokens, reorder))
        assert got.shape == want.shape == (R, model.config.vocab_size)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=f"step {step}")
        tokens = mx.array(rng.integers(1000, 3000, (R, 1)), dtype=mx.int32)
        if beams > 1:  # beams move between rows of their own input, as beam search moves them
            reorder = mx.array([b * beams + int(k) for b in range(2) for k in rng.integers(0, beams, beams)], dtype=mx.int32)


@pytest.mark.parametrize("share", [False, True])
def test_c_and_mlx_steps_write_the_same_summaries(tiny_config, share, monkeypatch):
    model = _model(tiny_config, share, seed=3)
    src, mask = _src()
    for cfg in (
        DecodingConfig(max_length=16, no_repeat_ngram_size=0),
        DecodingConfig(max_length=16, num_beams=3, no_repeat_ngram_size=2, length_penalty=1.5),
        DecodingConfig(max_length=16, do_sample=True, temperature=0.8, top_k=20, seed=5),
    ):
        monkeypatch.setenv("B2B_CPU_STEP", "0")
        want = [h.tokens for h in generate(model, src, mask, cfg)]
        monkeypatch.setenv("B2B_CPU_STEP", "1")
        assert [h.tokens for h in generate(model, src, mask, cfg)] == want, cfg


def test_it_steps_aside_where_it_does_not_apply(tiny_config, monkeypatch):
    import b2b

    model = _model(tiny_config, share=False)
    assert cpu_step.applies(model) and b2b.runtime_info()["cpu_step"] is True
    monkeypatch.setenv("B2B_CPU_STEP", "0")
    assert not cpu_step.applies(model) and b2b.runtime_info()["cpu_step"] is False
    monkeypatch.setenv("B2B_CPU_STEP", "1")
    model.train()
    assert not cpu_step.applies(model)  # dropout: the C step has none
    model.eval()
    model.set_dtype(mx.float16)
    assert not cpu_step.applies(model)  # float32 weights only
    src, mask = _src()
    hyps = generate(model, src, mask, DecodingConfig(max_length=5))  # float16 still decodes (in MLX)
    assert len(hyps) == 2


def test_bad_tokens_and_positions_raise_instead_of_reading_out_of_bounds(tiny_config, monkeypatch):
    model = _model(tiny_config, share=False)
    _, in_c = _steppers(model, 1, log_probs=False, monkeypatch=monkeypatch)
    with pytest.raises(ValueError, match="token ids"):
        in_c(mx.array([[101], [model.config.vocab_size]], dtype=mx.int32))
    with pytest.raises(ValueError, match="token ids"):
        in_c(mx.array([[101]], dtype=mx.int32))  # one row for two inputs
    tokens = mx.full((2, 1), 101, dtype=mx.int32)
    for _ in range(32):  # capacity: 20 steps rounded up to 32
        in_c(tokens)
    with pytest.raises(ValueError, match="capacity"):
        in_c(tokens)
