"""Inputs and weights shared by both sides, written once by the parent process.

The parent builds the b2b models (fixed seeds), writes b2b weights and the same weights under
Hugging Face names, and tokenizes the batches; each worker then loads only its own framework,
so peak memory is measured per side."""
from __future__ import annotations

import json
import os
from dataclasses import dataclass

import numpy as np

import b2b  # noqa: F401 - preloads the BLAS before mlx.core
import mlx.core as mx
from mlx.utils import tree_flatten, tree_map

from b2b import B2BConfig, Bert2Bert, Tokenizer, load_hf_bert
from b2b.convert import to_hf_encoder_decoder
from train.batching import collate
from train.text_data import pack_mlm_blocks
from train.masking import mask_tokens, max_predictions

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ARTICLES = os.path.join(REPO, "tests", "fixtures", "cnndm_sample.jsonl")
MINILM = os.environ.get("B2B_BENCH_MINILM", os.path.join(os.path.dirname(REPO), "shared", "models", "minilm-l6-h384-uncased"))


@dataclass(frozen=True)
class Shapes:
    mlm_batch: int = 32
    mlm_seq: int = 128
    ft_batch: int = 8
    ft_source: int = 512
    ft_target: int = 128
    gen_articles: int = 20
    gen_batch: int = 8
    gen_source: int = 512
    max_new_tokens: int = 128


def read_articles(n: int | None = None) -> list[dict]:
    with open(ARTICLES) as f:
        rows = [json.loads(line) for line in f]
    return rows[:n] if n else rows


def hf_config(cfg: B2BConfig, decoder: bool = False) -> dict:
    """transformers.BertConfig kwargs for a b2b architecture. Attention-probability dropout is
    off: b2b applies dropout to hidden states only, so both sides do the same work."""
    kw = dict(
        vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, num_hidden_layers=cfg.encoder_layers,
        num_attention_heads=cfg.num_heads, intermediate_size=cfg.ffn_size, max_position_embeddings=cfg.max_positions,
        type_vocab_size=cfg.type_vocab_size, layer_norm_eps=cfg.layer_norm_eps, hidden_dropout_prob=cfg.dropout,
        attention_probs_dropout_prob=0.0, hidden_act="gelu", pad_token_id=cfg.pad_id,
    )
    if decoder:
        kw.update(num_hidden_layers=cfg.decoder_layers, is_decoder=True, add_cross_attention=True)
    return kw


def to_hf_masked_lm(model: Bert2Bert) -> dict[str, np.ndarray]:
    """The encoder and its MLM head as a BertForMaskedLM state dict."""
    out = {}
    for name, value in to_hf_encoder_decoder(model).items():
        if name.startswith("encoder.") and not name.startswith("encoder.pooler."):
            out["bert." + name[len("encoder."):]] = value
    p = {k: np.array(v.astype(mx.float32)) for k, v in tree_flatten(model.encoder.mlm_head.parameters())}
    out.update({
        "cls.predictions.transform.dense.weight": p["transform.weight"],
        "cls.predictions.transform.dense.bias": p["transform.bias"],
        "cls.predictions.transform.LayerNorm.weight": p["norm.weight"],
        "cls.predictions.transform.LayerNorm.bias": p["norm.bias"],
        "cls.predictions.bias": p["bias"],
        "cls.predictions.decoder.bias": p["bias"],
        "cls.predictions.decoder.weight": out["bert.embeddings.word_embeddings.weight"],
    })
    return out


def _save(folder: str, model: Bert2Bert, hf_state: dict[str, np.ndarray], hf_kind: str) -> None:
    from safetensors.numpy import save_file

    os.makedirs(folder, exist_ok=True)
    model.config.save(folder)
    mx.save_safetensors(os.path.join(folder, "model.safetensors"), dict(tree_flatten(model.parameters())))
    save_file({k: np.ascontiguousarray(v) for k, v in hf_state.items()}, os.path.join(folder, "hf.safetensors"))
    meta = {"kind": hf_kind, "encoder": hf_config(model.config)}
    if hf_kind == "encoder-decoder":
        meta["decoder"] = hf_config(model.config, decoder=True)
    with open(os.path.join(folder, "hf_config.json"), "w") as f:
        json.dump(meta, f, indent=2)


def write_models(root: str, presets: list[str], half_values: bool = True) -> dict[str, str]:
    """b2b + HF weights for each model the rows need: `<preset>-mlm` (encoder only) and
    `minilm-s2s` (the warm-started BERT2BERT). With `half_values`, minilm-s2s's weights are
    rounded to values float16 holds, as a checkpoint exported in float16 (the shipped one)
    loads: both sides get the same float32 tensors and compute in float32, and b2b's C decoding
    step can read its float16 copies (cpu_step.py). Returns name -> folder."""
    folders = {}
    for preset in presets:
        mx.random.seed(0)
        if preset == "minilm":
            if not os.path.isdir(MINILM):
                raise FileNotFoundError(f"The minilm rows need the shared MiniLM weights in {MINILM}.")
            model = load_hf_bert(MINILM, decoder_layers=0)
        else:
            model = Bert2Bert(B2BConfig.preset(preset, decoder_layers=0))
        folders[f"{preset}-mlm"] = os.path.join(root, f"{preset}-mlm")
        _save(folders[f"{preset}-mlm"], model, to_hf_masked_lm(model), "masked-lm")
    mx.random.seed(0)  # the fresh cross-attention is seeded: both sides get the same draw
    model = load_hf_bert(MINILM)
    if half_values:
        model.update(tree_map(lambda a: a.astype(mx.float16).astype(mx.float32), model.parameters()))
    folders["minilm-s2s"] = os.path.join(root, "minilm-s2s")
    _save(folders["minilm-s2s"], model, to_hf_encoder_decoder(model), "encoder-decoder")
    return folders


def write_inputs(path: str, tok: Tokenizer, shapes: Shapes) -> None:
    """Every batch both sides consume, as int32 numpy arrays in one .npz file."""
    rows = read_articles()
    rng = np.random.default_rng(0)
    # MLM: packed [CLS] ... [SEP] blocks of real text, BERT masking (80/10/10) on 15%.
    blocks = pack_mlm_blocks([r["article"] for r in rows[:80]], tok, shapes.mlm_seq)
    blocks = blocks[(blocks != tok.pad_id).all(axis=1)][: shapes.mlm_batch]  # full blocks: no padding
    specials = {tok.pad_id, tok.cls_id, tok.sep_id, tok.mask_id, tok.unk_id}
    m = mask_tokens(blocks, rng, specials, tok.vocab_size, tok.mask_id, 0.15, max_predictions(shapes.mlm_seq))
    hf_labels = np.full(blocks.shape, -100, dtype=np.int64)
    for b in range(blocks.shape[0]):
        real = m.weights[b] > 0
        hf_labels[b, m.positions[b, real]] = m.labels[b, real]
    # Fine-tuning: articles truncated to 512 tokens, summaries to 128 ([CLS] ... [SEP]), padded
    # to the batch's longest as train.finetune (and HF's DataCollatorForSeq2Seq) do: both
    # sides get these same arrays; labels are the targets shifted by one.
    ft = rows[100 : 100 + shapes.ft_batch]
    src = [np.array(tok.encode(r["article"], max_length=shapes.ft_source).ids, np.int32) for r in ft]
    tgt = [np.array(tok.encode(r["highlights"], max_length=shapes.ft_target).ids, np.int32) for r in ft]
    src = collate(src, tok.pad_id, pad_to_multiple=32)
    tgt = collate(tgt, tok.pad_id, pad_to_multiple=16)
    tgt = np.concatenate([tgt, np.full((len(ft), 1), tok.pad_id, np.int32)], axis=1)  # (B, T + 1): labels shift
    # Generation: the first articles of the fixture, each truncated to 512 tokens.
    gen = [np.array(tok.encode(r["article"], max_length=shapes.gen_source).ids, np.int32) for r in rows[: shapes.gen_articles]]
    gen_ids = collate(gen, tok.pad_id, pad_to_multiple=1)
    np.savez(
        path,
        mlm_inputs=m.inputs, mlm_mask=np.ones_like(m.inputs), mlm_positions=m.positions, mlm_labels=m.labels,
        mlm_weights=m.weights, mlm_hf_labels=hf_labels,
        ft_src=src, ft_mask=(src != tok.pad_id).astype(np.int32), ft_tgt=tgt,
        gen_ids=gen_ids, gen_lengths=np.array([len(g) for g in gen], np.int32),
    )
