"""Hugging Face BERT weights: parity with transformers (needs torch and ../shared), the
warm start, and the export back to an EncoderDecoderModel."""
import json

import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_flatten

from b2b import B2BConfig, Bert2Bert, ConversionError, load_checkpoint, load_hf_bert
from b2b.convert import config_from_hf, map_hf_weights, to_hf_encoder_decoder

from conftest import MINILM, need_shared


def _torch():
    return pytest.importorskip("torch", reason="torch is optional (pip install torch==2.13.0); CI installs it")


def _inputs(tokenizer):
    texts = ["The quick brown fox jumps over the lazy dog.", "( CNN ) -- Officials said on Tuesday that the bridge will reopen."]
    batch = tokenizer.batch_encode(texts, max_length=64)
    return batch.ids, batch.attention_mask


def test_encoder_matches_transformers_bertmodel(tokenizer):
    torch = _torch()
    need_shared("models", "minilm-l6-h384-uncased", "model.safetensors")
    import transformers

    ids, mask = _inputs(tokenizer)
    hf = transformers.BertModel.from_pretrained(str(MINILM)).eval()
    with torch.no_grad():
        ref = hf(input_ids=torch.tensor(ids.astype(np.int64)), attention_mask=torch.tensor(mask.astype(np.int64))).last_hidden_state.numpy()
    model = load_hf_bert(str(MINILM))
    model.eval()
    ours = np.array(model.encode(mx.array(ids), mx.array(mask)))
    real = mask.astype(bool)
    assert np.abs(ours[real] - ref[real]).max() < 1e-4


def test_encoder_decoder_matches_transformers(tiny_config, tokenizer):
    torch = _torch()
    import transformers

    mx.random.seed(3)
    model = Bert2Bert(tiny_config)
    model.eval()
    c = tiny_config
    kw = dict(vocab_size=c.vocab_size, hidden_size=c.hidden_size, num_hidden_layers=c.encoder_layers,
              num_attention_heads=c.num_heads, intermediate_size=c.ffn_size, max_position_embeddings=c.max_positions)
    cfg = transformers.EncoderDecoderConfig.from_encoder_decoder_configs(
        transformers.BertConfig(**kw), transformers.BertConfig(**kw, is_decoder=True, add_cross_attention=True))
    hf = transformers.EncoderDecoderModel(config=cfg).eval()
    missing, unexpected = hf.load_state_dict({k: torch.tensor(v) for k, v in to_hf_encoder_decoder(model).items()}, strict=False)
    assert not unexpected and not [k for k in missing if "position_ids" not in k]
    ids, mask = _inputs(tokenizer)
    tgt = ids[:, :6]
    with torch.no_grad():
        ref = hf(input_ids=torch.tensor(ids.astype(np.int64)), attention_mask=torch.tensor(mask.astype(np.int64)),
                 decoder_input_ids=torch.tensor(tgt.astype(np.int64))).logits.numpy()
    ours = np.array(model(mx.array(ids), mx.array(mask), mx.array(tgt)))
    assert np.abs(ours - ref).max() < 1e-4


def test_to_hf_model_generates_what_b2b_generates(tiny_config, tokenizer):
    torch = _torch()
    pytest.importorskip("transformers", reason="transformers is optional; CI installs it")
    from b2b import DecodingConfig, to_hf_model
    from b2b.generate import generate

    mx.random.seed(5)
    model = Bert2Bert(tiny_config)
    model.eval()
    hf = to_hf_model(model)
    ids, mask = _inputs(tokenizer)
    for beams in (1, 3):
        ours = generate(model, mx.array(ids), mx.array(mask),
                        DecodingConfig(max_length=12, min_length=12, num_beams=beams, no_repeat_ngram_size=0))
        with torch.no_grad():
            theirs = hf.generate(input_ids=torch.tensor(ids.astype(np.int64)), attention_mask=torch.tensor(mask.astype(np.int64)),
                                 max_new_tokens=12, min_new_tokens=12, num_beams=beams, do_sample=False)
        assert [h.tokens for h in ours] == [row[1:] for row in theirs.tolist()]  # HF keeps the start token

    # [SEP] made likely: both stop where it comes (beams: once every beam has, as both are told)
    bias = np.zeros(tiny_config.vocab_size, np.float32)
    bias[tiny_config.sep_id] = 9.0
    model.decoder.lm_head.bias = mx.array(bias)
    hf = to_hf_model(model)
    for beams in (1, 3):
        ours = generate(model, mx.array(ids), mx.array(mask),
                        DecodingConfig(max_length=12, min_length=2, num_beams=beams, no_repeat_ngram_size=0, early_stopping=True))
        with torch.no_grad():
            theirs = hf.generate(input_ids=torch.tensor(ids.astype(np.int64)), attention_mask=torch.tensor(mask.astype(np.int64)),
                                 max_new_tokens=12, min_new_tokens=2, num_beams=beams, do_sample=False, early_stopping=True)
        rows = theirs.tolist()
        assert any(tiny_config.sep_id in row for row in rows)  # the case is exercised
        # b2b's tokens end before [SEP]; HF's row starts with [CLS] and pads after [SEP]
        assert [h.tokens for h in ours] == [row[1:row.index(tiny_config.sep_id)] if tiny_config.sep_id in row else row[1:] for row in rows]
        assert [h.finish_reason for h in ours] == ["eos" if tiny_config.sep_id in row else "length" for row in rows]

    share = Bert2Bert(B2BConfig.preset("tiny", share_encoder_decoder=True))
    with pytest.raises(ConversionError, match="BERTShare"):
        to_hf_model(share)
    with pytest.raises(ConversionError, match="tie"):
        to_hf_model(Bert2Bert(B2BConfig.preset("tiny", tie_embeddings=False)))


def test_warm_start_fills_decoder_from_bert(tmp_path):
    need_shared("models", "minilm-l6-h384-uncased", "model.safetensors")
    model = load_hf_bert(str(MINILM))
    p = dict(tree_flatten(model.parameters()))
    assert np.array_equal(np.array(p["encoder.layers.2.ffn.up.weight"]), np.array(p["decoder.layers.2.ffn.up.weight"]))
    assert np.array_equal(np.array(p["encoder.embeddings.position.weight"]), np.array(p["decoder.embeddings.position.weight"]))
    assert not np.array_equal(np.array(p["decoder.layers.0.cross_attn.query.weight"]), np.array(p["decoder.layers.0.self_attn.query.weight"]))
    # load_checkpoint recognises a Hugging Face folder and warm-starts from it
    loaded, tok = load_checkpoint(str(MINILM))
    assert loaded.config.hidden_size == 384 and tok.vocab_size == 30522


def test_mapping_covers_every_tensor_of_a_synthetic_bert():
    cfg = B2BConfig.preset("tiny")
    names = ["embeddings.word_embeddings.weight", "embeddings.position_embeddings.weight",
             "embeddings.token_type_embeddings.weight", "embeddings.LayerNorm.gamma", "embeddings.LayerNorm.beta"]
    for i in range(cfg.encoder_layers):
        for part in ("attention.self.query", "attention.self.key", "attention.self.value", "attention.output.dense",
                     "intermediate.dense", "output.dense"):
            names += [f"encoder.layer.{i}.{part}.weight", f"encoder.layer.{i}.{part}.bias"]
        for part in ("attention.output.LayerNorm", "output.LayerNorm"):
            names += [f"encoder.layer.{i}.{part}.weight", f"encoder.layer.{i}.{part}.bias"]
    hf = {"bert." + n: np.zeros(1) for n in names}
    hf.update({"cls.predictions.bias": np.zeros(1), "cls.predictions.transform.dense.weight": np.zeros(1)})
    mapped = map_hf_weights(hf, cfg)
    assert len([k for k in mapped if k.startswith("encoder.")]) == len(names) + 2
    assert "decoder.layers.1.self_attn_norm.weight" in mapped and "decoder.lm_head.bias" in mapped
    assert not any(k.startswith("decoder.embeddings.word") for k in mapped)


def test_config_from_hf(tmp_path):
    hf = {"model_type": "bert", "vocab_size": 30522, "hidden_size": 384, "num_hidden_layers": 6,
          "num_attention_heads": 12, "intermediate_size": 1536, "max_position_embeddings": 512}
    cfg = config_from_hf(hf)
    assert (cfg.encoder_layers, cfg.decoder_layers, cfg.num_heads) == (6, 6, 12)
    assert config_from_hf(json.loads(json.dumps(hf)), share_encoder_decoder=True).share_encoder_decoder


def test_load_hf_bert_returns_an_eval_model(tmp_path, tiny_config):
    c = tiny_config
    hf_config = {"model_type": "bert", "vocab_size": c.vocab_size, "hidden_size": c.hidden_size,
                 "num_hidden_layers": c.encoder_layers, "num_attention_heads": c.num_heads,
                 "intermediate_size": c.ffn_size, "max_position_embeddings": c.max_positions}
    (tmp_path / "config.json").write_text(json.dumps(hf_config))
    word = mx.random.normal((c.vocab_size, c.hidden_size)) * 0.02
    mx.save_safetensors(str(tmp_path / "model.safetensors"), {"bert.embeddings.word_embeddings.weight": word})
    model = load_hf_bert(str(tmp_path))
    assert not model.training
    assert np.array_equal(np.array(model.encoder.embeddings.word.weight), np.array(word))
