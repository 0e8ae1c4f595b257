"""Decoding strategies on a tiny random model: constraints hold, batching and beams agree."""
import mlx.core as mx
import numpy as np
import pytest

from b2b import DecodingConfig, DecodingError, generate
from b2b.generate import beam_search, greedy_or_sample


def _src():
    src = mx.array([[101, 2000, 2001, 2002, 2003, 102, 0, 0], [101, 2004, 2005, 2006, 2007, 2008, 2009, 102]])
    return src, (src > 0).astype(mx.int32)


def _last(it):
    out = None
    for out in it:
        pass
    return out


def _ngrams(seq, n):
    return [tuple(seq[i : i + n]) for i in range(len(seq) - n + 1)]


def test_greedy_matches_argmax_of_full_pass(tiny_model):
    src, mask = _src()
    cfg = DecodingConfig(max_length=6, no_repeat_ngram_size=0)
    hyps = generate(tiny_model, src, mask, cfg)
    for b, h in enumerate(hyps):
        tgt = mx.array([[101] + h.tokens[:-1]])
        logits = tiny_model(src[b : b + 1], mask[b : b + 1], tgt)
        assert np.array(mx.argmax(logits, -1))[0].tolist() == h.tokens


def test_beam_search_with_one_beam_equals_greedy(tiny_model):
    src, mask = _src()
    cfg = DecodingConfig(max_length=8, no_repeat_ngram_size=0)
    memory = tiny_model.encode(src, mask)
    greedy = _last(greedy_or_sample(tiny_model, memory, mask, cfg))
    beam = _last(beam_search(tiny_model, memory, mask, cfg))
    assert [h.tokens for h in greedy] == [h.tokens for h in beam]


def test_batched_generation_matches_one_by_one(tiny_model):
    src, mask = _src()
    for cfg in (DecodingConfig(max_length=6), DecodingConfig(max_length=6, num_beams=3)):
        together = generate(tiny_model, src, mask, cfg)
        for b in range(2):
            n = int(mask[b].sum())
            alone = generate(tiny_model, src[b : b + 1, :n], mask[b : b + 1, :n], cfg)
            assert alone[0].tokens == together[b].tokens


def test_no_repeat_ngram_size_holds(tiny_model):
    src, mask = _src()
    # Make two tokens dominate so unconstrained decoding loops on them.
    bias = np.zeros(tiny_model.config.vocab_size, dtype=np.float32)
    bias[[2000, 2001]] = 50.0
    tiny_model.decoder.lm_head.bias = mx.array(bias)
    free = generate(tiny_model, src, mask, DecodingConfig(max_length=40, no_repeat_ngram_size=0))
    # A random tiny model loops; the constraint must break every loop.
    assert any(len(set(_ngrams(h.tokens, 2))) < len(_ngrams(h.tokens, 2)) for h in free)
    for beams in (1, 3):
        for h in generate(tiny_model, src, mask, DecodingConfig(max_length=40, num_beams=beams, no_repeat_ngram_size=2)):
            grams = _ngrams(h.tokens, 2)
            assert len(grams) == len(set(grams))


def test_min_and_max_length(tiny_model):
    src, mask = _src()
    for beams in (1, 2):
        for h in generate(tiny_model, src, mask, DecodingConfig(max_length=5, min_length=5, num_beams=beams)):
            assert len(h.tokens) == 5 and h.finish_reason == "length"


def test_sampling_is_reproducible_with_a_seed(tiny_model):
    src, mask = _src()
    cfg = DecodingConfig(max_length=10, do_sample=True, temperature=1.5, top_k=50, top_p=0.9, seed=7)
    a = generate(tiny_model, src, mask, cfg)
    b = generate(tiny_model, src, mask, cfg)
    assert [h.tokens for h in a] == [h.tokens for h in b]
    c = generate(tiny_model, src, mask, DecodingConfig(max_length=10, do_sample=True, temperature=1.5, seed=8))
    assert [h.tokens for h in a] != [h.tokens for h in c]


def test_top_k_one_is_greedy(tiny_model):
    src, mask = _src()
    greedy = generate(tiny_model, src, mask, DecodingConfig(max_length=8))
    sampled = generate(tiny_model, src, mask, DecodingConfig(max_length=8, do_sample=True, top_k=1, seed=3))
    assert [h.tokens for h in greedy] == [h.tokens for h in sampled]


@pytest.mark.parametrize(
    "bad",
    [dict(num_beams=0), dict(max_length=5, min_length=10), dict(top_p=0.0), dict(top_p=1.5), dict(temperature=-1.0),
     dict(max_length=0), dict(do_sample=True, num_beams=2)],
)
def test_invalid_settings_raise_one_sentence(bad):
    with pytest.raises(DecodingError) as e:
        DecodingConfig(**bad)
    assert isinstance(e.value, ValueError) and str(e.value).endswith(".")
