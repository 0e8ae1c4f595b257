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
    memory, src_mask, _ = _encode(model, src, mask)
    monkeypatch.setenv("B2B_CPU_STEP", "0")
    in_mlx = _Stepper(model, memory, src_mask, 20, beams=beams, log_probs=log_probs)
    monkeypatch.setenv("B2B_CPU_STEP", "1")
    in_c = _Stepper(model, memory, src_mask, 20, beams=beams, log_probs=log_probs)
    assert in_mlx.in_c is None and in_c.in_c is not None
    return in_mlx, in_c


def _round_to_half(model: Bert2Bert) -> Bert2Bert:
    """float32 weights that float16 holds exactly, as a checkpoint saved in float16 loads."""
    from mlx.utils import tree_map

    model.update(tree_map(lambda a: a.astype(mx.float16).astype(mx.float32), model.parameters()))
    return model


@pytest.mark.parametrize("share", [False, True])
@pytest.mark.parametrize("beams", [1, 3])
@pytest.mark.parametrize("half", [False, True])
def test_c_step_gives_the_mlx_step_logits(tiny_config, share, beams, half, monkeypatch):
    model = _model(tiny_config, share)
    if half:
        _round_to_half(model)
    in_mlx, in_c = _steppers(model, beams, log_probs=beams > 1, monkeypatch=monkeypatch)
    if cpu_step.half_enabled():
        # Only exact float16 copies are read: 2 + 8 per layer matrices, fewer where shared.
        assert (in_c.in_c.half_matrices > 0) == half
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


@pytest.mark.parametrize("half", [False, True])
def test_odd_sizes_and_long_padded_sources(tiny_config, half, monkeypatch):
    # Hidden 36, FFN 70, heads of 9: no size is a multiple of any vector width, so every
    # remainder loop runs; 45 source tokens, one input padded: the vector softmax meets masked keys.
    model = _model(tiny_config.replace(hidden_size=36, ffn_size=70), share=False)
    if half:
        _round_to_half(model)
    rng = np.random.default_rng(7)
    src = rng.integers(1000, 3000, (2, 45))
    src[1, 30:] = 0
    src = mx.array(src, dtype=mx.int32)
    memory, src_mask, _ = _encode(model, src, (src > 0).astype(mx.int32))
    steppers = []
    for flag in ("0", "1"):
        monkeypatch.setenv("B2B_CPU_STEP", flag)
        steppers.append(_Stepper(model, memory, src_mask, 20, beams=3, log_probs=True))
    in_mlx, in_c = steppers
    assert in_c.in_c is not None
    tokens = mx.array([[101], [2000], [2001], [2002], [2003], [2004]], dtype=mx.int32)
    for step in range(3):
        np.testing.assert_allclose(in_c(tokens), in_mlx(tokens), rtol=1e-4, atol=1e-4, err_msg=f"step {step}")


def test_float16_copies_round_like_numpy_and_say_when_they_are_exact():
    if not cpu_step.half_enabled():
        pytest.skip("no float16 conversion in this build")
    lib = cpu_step._library()
    rng = np.random.default_rng(0)
    halves = rng.normal(size=1003).astype(np.float16).astype(np.float32)
    for values, exact in ((rng.normal(size=1003).astype(np.float32), False),
                          (halves, True),
                          (np.array([1e-7, 7e4, -0.0, 1.0, 0.5, 2.0, 3.0, 4.0, 5.0], np.float32), False),  # subnormal, overflow
                          (np.concatenate([halves[:16], [np.nan]]).astype(np.float32), False)):
        out = np.empty(values.shape, np.float16)
        got = lib.b2b_to_half(values.ctypes.data_as(cpu_step._F32P), out.ctypes.data, values.size)
        with np.errstate(over="ignore", invalid="ignore"):
            want = values.astype(np.float16)
        np.testing.assert_array_equal(out, want)
        assert bool(got) == exact


def test_float16_copies_can_be_turned_off(tiny_config, monkeypatch):
    model = _round_to_half(_model(tiny_config, share=False))
    monkeypatch.setenv("B2B_CPU_STEP_HALF", "0")
    _, in_c = _steppers(model, 1, log_probs=False, monkeypatch=monkeypatch)
    assert in_c.in_c.half_matrices == 0


def test_one_thread_writes_what_all_threads_write(tiny_config, monkeypatch):
    # Beside busy processes the step runs on the cores they leave free (b2b/cpu_load.py): the
    # same summaries, whatever the number of threads.
    model = _model(tiny_config, share=True, seed=4)
    src, mask = _src()
    cfg = DecodingConfig(max_length=16, num_beams=3, no_repeat_ngram_size=0)
    got = {}
    for n in (1, 0):
        monkeypatch.setattr(cpu_step._load, "threads", lambda n=n: n)
        got[n] = [h.tokens for h in generate(model, src, mask, cfg)]
    assert got[1] == got[0]
