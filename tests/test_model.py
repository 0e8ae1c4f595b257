"""Shapes, the two attention paths, cached decoding and BERTShare on tiny configs."""
import mlx.core as mx
import numpy as np
import pytest

from b2b import B2BConfig, Bert2Bert, ConfigError, Intermediates
from b2b.layers import attention_explicit


def _batch():
    src = mx.array([[101, 2000, 2001, 2002, 102, 0, 0], [101, 2003, 2004, 2005, 2006, 2007, 102]])
    tgt = mx.array([[101, 2010, 2011, 2012, 2013], [101, 2014, 2015, 2016, 2017]])
    return src, (src > 0).astype(mx.int32), tgt


def test_shapes(tiny_model, tiny_config):
    src, mask, tgt = _batch()
    memory = tiny_model.encode(src, mask)
    assert memory.shape == (2, 7, tiny_config.hidden_size)
    assert tiny_model(src, mask, tgt).shape == (2, 5, tiny_config.vocab_size)
    assert tiny_model.encoder.nsp_logits(memory).shape == (2, 2)
    assert tiny_model.encoder.mlm_logits(memory[:, :3].reshape(-1, tiny_config.hidden_size)).shape == (6, tiny_config.vocab_size)


def test_fast_and_explicit_attention_agree():
    mx.random.seed(1)
    q, k, v = (mx.random.normal((2, 4, 6, 8)) for _ in range(3))
    pad = mx.array([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]]).astype(mx.bool_)[:, None, None, :]
    for mask in (None, pad, "causal"):
        fast = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.35, mask=mask)
        slow, weights = attention_explicit(q, k, v, 0.35, mask)
        assert np.allclose(np.array(fast), np.array(slow), atol=1e-5)
        assert np.allclose(np.array(weights.sum(-1)), 1.0, atol=1e-5)
    _, w = attention_explicit(q, k, v, 0.35, "causal")
    assert float(mx.triu(w[0, 0], k=1).abs().max()) == 0.0  # no peeking at later tokens


@pytest.mark.parametrize("explicit", [False, True])
def test_beams_sharing_their_inputs_keys_and_values(tiny_model, explicit):
    # Beam search holds cross-attention K/V once per input (B rows) for B * beams query rows;
    # Attention groups the rows by input. Same result as K/V repeated for every beam.
    mx.random.seed(2)
    attn = tiny_model.decoder.layers[0].cross_attn
    B, beams, S, C = 2, 3, 7, tiny_model.config.hidden_size
    x = mx.random.normal((B * beams, 1, C))
    kv = attn.project_kv(mx.random.normal((B, S, C)))
    mask = mx.array([[1] * 5 + [0] * 2, [1] * 7]).astype(mx.bool_)[:, None, None, :]
    rows = mx.repeat(mx.arange(B), beams)
    shared, w_shared = attn(x, kv, mask, return_weights=explicit)
    repeated, w_repeated = attn(x, (kv[0][rows], kv[1][rows]), mask[rows], return_weights=explicit)
    assert shared.shape == (B * beams, 1, C)
    assert np.allclose(np.array(shared), np.array(repeated), atol=1e-5)
    if explicit:
        assert w_shared.shape == w_repeated.shape == (B * beams, tiny_model.config.num_heads, 1, S)
        assert np.allclose(np.array(w_shared), np.array(w_repeated), atol=1e-6)


def test_model_with_and_without_attention_maps_agree(tiny_model):
    src, mask, tgt = _batch()
    plain = tiny_model(src, mask, tgt)
    inter = Intermediates()
    h = tiny_model.decode(tgt, tiny_model.encode(src, mask, inter), mask, intermediates=inter)
    assert np.allclose(np.array(plain), np.array(tiny_model.lm_logits(h)), atol=1e-4)
    L, H = 2, 4
    assert len(inter.encoder) == L and inter.encoder[0].shape == (2, H, 7, 7)
    assert len(inter.decoder) == L and inter.decoder[0].shape == (2, H, 5, 5)
    assert len(inter.cross) == L and inter.cross[0].shape == (2, H, 5, 7)
    # padded source positions get no cross-attention
    assert float(inter.cross[0][0, :, :, 5:].max()) == 0.0


@pytest.mark.parametrize("share", [False, True])
def test_cached_decoding_matches_full_pass(tiny_config, share):
    mx.random.seed(2)
    model = Bert2Bert(tiny_config.replace(share_encoder_decoder=share))
    model.eval()
    src, mask, tgt = _batch()
    full = model(src, mask, tgt)  # (B, T, V)
    cache = model.make_cache(model.encode(src, mask), mask)
    steps = [model.decode_step(tgt[:, t : t + 1], cache) for t in range(tgt.shape[1])]
    assert cache.offset == tgt.shape[1]
    assert np.allclose(np.array(mx.stack(steps, axis=1)), np.array(full), atol=1e-4)


def test_padding_does_not_change_encoding(tiny_model):
    a = mx.array([[101, 2000, 2001, 102]])
    b = mx.array([[101, 2000, 2001, 102, 0, 0, 0]])
    ha = tiny_model.encode(a, mx.ones_like(a))
    hb = tiny_model.encode(b, (b > 0).astype(mx.int32))
    assert np.allclose(np.array(ha), np.array(hb[:, :4]), atol=1e-5)


def test_bertshare_has_fewer_parameters(tiny_config):
    full = Bert2Bert(tiny_config).num_parameters()
    shared = Bert2Bert(tiny_config.replace(share_encoder_decoder=True)).num_parameters()
    assert shared < full


def test_config_validation_and_presets(tmp_path):
    with pytest.raises(ConfigError, match="divisible"):
        B2BConfig(hidden_size=30, num_heads=4)
    with pytest.raises(ConfigError, match="Unknown preset"):
        B2BConfig.preset("huge")
    cfg = B2BConfig.preset("minilm")
    assert (cfg.hidden_size, cfg.encoder_layers, cfg.num_heads, cfg.ffn_size) == (384, 6, 12, 1536)
    cfg.save(str(tmp_path))
    assert B2BConfig.load(str(tmp_path)) == cfg
    assert B2BConfig.from_dict({**cfg.to_dict(), "future_field": 1}) == cfg


@pytest.mark.parametrize(
    "bad, name",
    [(dict(hidden_size="256"), "hidden_size"), (dict(dropout=None), "dropout"), (dict(tie_embeddings=1), "tie_embeddings"),
     (dict(encoder_layers=2.0), "encoder_layers"), (dict(vocab_size=True), "vocab_size")],
)
def test_config_wrong_types_are_config_errors(bad, name):
    with pytest.raises(ConfigError, match=name) as e:
        B2BConfig(**bad)
    assert str(e.value).endswith(".")
