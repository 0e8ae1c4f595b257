"""Hugging Face BERT weights <-> b2b: the one place that knows both naming schemes.

Reads BertModel / BertForMaskedLM / BertForPreTraining safetensors (warm start, Rothe et al.
2020: the encoder and the decoder both start from BERT, cross-attention is new) and HF
EncoderDecoderModel (bert2bert) checkpoints; writes EncoderDecoderModel state dicts (used to
compare against transformers)."""
from __future__ import annotations

import json
import logging
import os
import re

import mlx.core as mx
import numpy as np

from .config import B2BConfig
from .model import Bert2Bert

log = logging.getLogger(__name__)


class ConversionError(ValueError):
    """Foreign weights that cannot be mapped onto the b2b architecture."""


# HF name inside one BERT layer -> b2b name inside an encoder/decoder layer.
_LAYER = {
    "attention.self.query": "self_attn.query",
    "attention.self.key": "self_attn.key",
    "attention.self.value": "self_attn.value",
    "attention.output.dense": "self_attn.out",
    "attention.output.LayerNorm": "self_attn_norm",
    "crossattention.self.query": "cross_attn.query",
    "crossattention.self.key": "cross_attn.key",
    "crossattention.self.value": "cross_attn.value",
    "crossattention.output.dense": "cross_attn.out",
    "crossattention.output.LayerNorm": "cross_attn_norm",
    "intermediate.dense": "ffn.up",
    "output.dense": "ffn.down",
    "output.LayerNorm": "ffn_norm",
}
_EMB = {
    "word_embeddings": "word",
    "position_embeddings": "position",
    "token_type_embeddings": "token_type",
    "LayerNorm": "norm",
}
_HEAD = {"transform.dense": "transform", "transform.LayerNorm": "norm"}


def config_from_hf(hf: dict, **overrides) -> B2BConfig:
    """B2BConfig from a Hugging Face BertConfig dict (an EncoderDecoderModel's `encoder`)."""
    if "encoder" in hf and isinstance(hf["encoder"], dict):
        enc, dec = hf["encoder"], hf.get("decoder", hf["encoder"])
    else:
        enc = dec = hf
    if enc.get("model_type", "bert") != "bert" and "hidden_size" not in enc:
        raise ConversionError(f"Expected a BERT config, got model_type {enc.get('model_type')!r}.")
    if enc.get("hidden_act", "gelu") not in ("gelu", "gelu_new", "gelu_python"):
        log.warning("hidden_act %r is computed as exact GELU.", enc.get("hidden_act"))
    fields = dict(
        vocab_size=enc["vocab_size"],
        hidden_size=enc["hidden_size"],
        encoder_layers=enc["num_hidden_layers"],
        decoder_layers=dec["num_hidden_layers"],
        num_heads=enc["num_attention_heads"],
        ffn_size=enc["intermediate_size"],
        max_positions=enc["max_position_embeddings"],
        type_vocab_size=enc.get("type_vocab_size", 2),
        layer_norm_eps=enc.get("layer_norm_eps", 1e-12),
        dropout=enc.get("hidden_dropout_prob", 0.1),
        pad_id=enc.get("pad_token_id", 0) or 0,
    )
    fields.update(overrides)
    return B2BConfig(**fields)


def _rename_stack(name: str, hf_prefix: str, ours: str) -> str | None:
    """Map one HF BERT tensor name (under `hf_prefix`) to b2b's name under `ours`, or None."""
    if not name.startswith(hf_prefix):
        return None
    rest = name[len(hf_prefix):].replace(".gamma", ".weight").replace(".beta", ".bias")
    m = re.fullmatch(r"embeddings\.(\w+)\.(weight|bias)", rest)
    if m and m.group(1) in _EMB:
        return f"{ours}.embeddings.{_EMB[m.group(1)]}.{m.group(2)}"
    m = re.fullmatch(r"encoder\.layer\.(\d+)\.(.+)\.(weight|bias)", rest)
    if m and m.group(2) in _LAYER:
        return f"{ours}.layers.{m.group(1)}.{_LAYER[m.group(2)]}.{m.group(3)}"
    m = re.fullmatch(r"pooler\.dense\.(weight|bias)", rest)
    if m and ours == "encoder":
        return f"encoder.pooler.{m.group(1)}"
    return None


def _rename_head(name: str, hf_prefix: str, head: str) -> str | None:
    if not name.startswith(hf_prefix):
        return None
    rest = name[len(hf_prefix):]
    if rest == "predictions.bias":
        return f"{head}.bias"
    m = re.fullmatch(r"predictions\.(transform\.\w+)\.(weight|bias|gamma|beta)", rest)
    if m and m.group(1) in _HEAD:
        kind = {"gamma": "weight", "beta": "bias"}.get(m.group(2), m.group(2))
        return f"{head}.{_HEAD[m.group(1)]}.{kind}"
    m = re.fullmatch(r"seq_relationship\.(weight|bias)", rest)
    if m and head == "encoder.mlm_head":
        return f"encoder.nsp_head.{m.group(1)}"
    return None


def map_hf_weights(hf: dict[str, np.ndarray], cfg: B2BConfig, warm_start_decoder: bool = True) -> dict:
    """HF tensor dict -> b2b tensor dict (numpy). A plain BERT fills the encoder and, with
    `warm_start_decoder`, the decoder's matching parts; an EncoderDecoderModel fills both."""
    is_enc_dec = any(k.startswith("decoder.bert.") for k in hf)
    out: dict[str, np.ndarray] = {}
    for name, value in hf.items():
        if is_enc_dec:
            targets = [
                _rename_stack(name, "encoder.", "encoder"),
                _rename_stack(name, "decoder.bert.", "decoder"),
                _rename_head(name, "decoder.cls.", "decoder.lm_head"),
            ]
        else:
            bare = name[5:] if name.startswith("bert.") else name
            targets = [_rename_stack(bare, "", "encoder"), _rename_head(name, "cls.", "encoder.mlm_head")]
            if warm_start_decoder and cfg.decoder_layers and not cfg.share_encoder_decoder:
                targets.append(_rename_stack(bare, "", "decoder"))
                targets.append(_rename_head(name, "cls.", "decoder.lm_head"))
        for t in targets:
            if t is not None and _fits(t, cfg):
                out[t] = value
    return out


def _fits(name: str, cfg: B2BConfig) -> bool:
    """False for tensors the architecture has no place for: the decoder's word table (shared
    with the encoder), decoder layers beyond `decoder_layers`, BERTShare's decoder copies."""
    if name.startswith("decoder.embeddings.word"):
        return False
    if name.startswith("decoder.") and cfg.share_encoder_decoder:
        return ".cross_attn" in name
    if name.startswith("decoder.layers."):
        return int(name.split(".")[2]) < cfg.decoder_layers
    return True


def read_safetensors(path: str) -> dict[str, np.ndarray]:
    """Tensors of a safetensors file as float32 numpy arrays (bf16/fp16 upcast)."""
    arrays = mx.load(path)
    return {k: np.array(v.astype(mx.float32)) for k, v in arrays.items()}


def resolve_hf_folder(name_or_path: str) -> str:
    """A local folder as is; otherwise download a hub repo (needs the network)."""
    if os.path.isdir(name_or_path):
        return name_or_path
    try:
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import HFValidationError
    except ImportError as e:  # pragma: no cover - huggingface_hub ships with transformers
        raise ConversionError("huggingface_hub is needed to download models from the hub.") from e
    try:
        return snapshot_download(name_or_path, allow_patterns=["*.json", "*.safetensors", "vocab.txt"])
    except (OSError, HFValidationError, ValueError) as e:
        raise FileNotFoundError(
            f"{name_or_path!r} is not a local folder and could not be fetched from the Hugging Face hub ({e.__class__.__name__})."
        ) from e


def load_hf_bert(name_or_path: str, warm_start_decoder: bool = True, **config_overrides) -> Bert2Bert:
    """A Bert2Bert warm-started from a Hugging Face BERT folder or hub id (config.json +
    model.safetensors). Weights with no BERT counterpart (cross-attention; the MLM head when
    the checkpoint has none) keep their fresh initialisation, and are logged. Returned in eval
    mode, like `load_checkpoint`."""
    folder = resolve_hf_folder(name_or_path)
    cfg_path = os.path.join(folder, "config.json")
    weights_path = os.path.join(folder, "model.safetensors")
    for p in (cfg_path, weights_path):
        if not os.path.isfile(p):
            raise FileNotFoundError(f"Missing {os.path.basename(p)} in {folder} (a safetensors BERT is required).")
    with open(cfg_path) as f:
        cfg = config_from_hf(json.load(f), **config_overrides)
    model = Bert2Bert(cfg)
    mapped = map_hf_weights(read_safetensors(weights_path), cfg, warm_start_decoder)
    from mlx.utils import tree_flatten

    ours = dict(tree_flatten(model.parameters()))
    for k, v in mapped.items():
        if k not in ours:
            raise ConversionError(f"Converted tensor {k} has no place in the model ({weights_path}).")
        if tuple(ours[k].shape) != tuple(v.shape):
            raise ConversionError(f"Tensor {k} has shape {v.shape}, expected {tuple(ours[k].shape)} ({weights_path}).")
    fresh = sorted(k for k in ours if k not in mapped)
    if fresh:
        log.info("%d tensors freshly initialised (not in %s): %s", len(fresh), folder, _summarize_names(fresh))
    model.load_weights([(k, mx.array(v)) for k, v in mapped.items()], strict=False)
    model.eval()  # ready to use as loaded (no dropout); a training loop switches it back on
    return model


def _summarize_names(names: list[str]) -> str:
    groups = sorted({re.sub(r"\.\d+\.", ".N.", n).rsplit(".", 1)[0] for n in names})
    return ", ".join(groups)


def to_hf_encoder_decoder(model: Bert2Bert) -> dict[str, np.ndarray]:
    """b2b weights as an HF EncoderDecoderModel (BertModel + BertLMHeadModel) state dict."""
    from mlx.utils import tree_flatten

    cfg = model.config
    if cfg.share_encoder_decoder:
        raise ConversionError("Export of BERTShare models is not supported; save it as a b2b checkpoint.")
    if not cfg.tie_embeddings:
        raise ConversionError("Export needs the LM head tied to the word embeddings (tie_embeddings), as BERT's is.")
    if cfg.pointer_generator:
        raise ConversionError("transformers' EncoderDecoderModel has no pointer-generator; save it as a b2b checkpoint.")
    inv_layer = {v: k for k, v in _LAYER.items()}
    inv_emb = {v: k for k, v in _EMB.items()}
    inv_head = {v: k for k, v in _HEAD.items()}
    out: dict[str, np.ndarray] = {}
    params = dict(tree_flatten(model.parameters()))
    for name, value in params.items():
        arr = np.array(value.astype(mx.float32))
        parts = name.split(".")
        stack, hf_stack = parts[0], ("encoder." if parts[0] == "encoder" else "decoder.bert.")
        if parts[1] == "embeddings":
            out[f"{hf_stack}embeddings.{inv_emb[parts[2]]}.{parts[3]}"] = arr
        elif parts[1] == "layers":
            inner = ".".join(parts[3:-1])
            out[f"{hf_stack}encoder.layer.{parts[2]}.{inv_layer[inner]}.{parts[-1]}"] = arr
        elif name.startswith("encoder.pooler"):
            out[f"encoder.pooler.dense.{parts[-1]}"] = arr
        elif parts[1] == "lm_head" and stack == "decoder":
            key = "predictions.bias" if parts[2] == "bias" else f"predictions.{inv_head[parts[2]]}.{parts[3]}"
            out[f"decoder.cls.{key}"] = arr
    word = np.array(model.encoder.embeddings.word.weight.astype(mx.float32))
    out["decoder.bert.embeddings.word_embeddings.weight"] = word
    out["decoder.cls.predictions.decoder.weight"] = word
    out["decoder.cls.predictions.decoder.bias"] = out["decoder.cls.predictions.bias"]
    return out


def to_hf_model(model: Bert2Bert):
    """`model` as a transformers `EncoderDecoderModel` (BertModel + BertLMHeadModel) in eval mode,
    for comparing with or handing to Hugging Face tools; needs torch and transformers. Its
    `generate()` starts from [CLS] and stops at [SEP] as b2b's does. BERT2BERT models without a
    pointer-generator only (transformers has neither BERTShare's sharing nor a pointer)."""
    try:
        import torch
        import transformers
    except ImportError as e:
        raise ConversionError("to_hf_model needs torch and transformers: pip install torch transformers.") from e
    state = to_hf_encoder_decoder(model)  # raises ConversionError for BERTShare and pointer models
    c = model.config
    common = dict(vocab_size=c.vocab_size, hidden_size=c.hidden_size, num_attention_heads=c.num_heads,
                  intermediate_size=c.ffn_size, max_position_embeddings=c.max_positions,
                  type_vocab_size=c.type_vocab_size, layer_norm_eps=c.layer_norm_eps, pad_token_id=c.pad_id)
    config = transformers.EncoderDecoderConfig.from_encoder_decoder_configs(
        transformers.BertConfig(num_hidden_layers=c.encoder_layers, **common),
        transformers.BertConfig(num_hidden_layers=c.decoder_layers, is_decoder=True, add_cross_attention=True, **common),
    )
    config.decoder_start_token_id, config.eos_token_id, config.pad_token_id = c.cls_id, c.sep_id, c.pad_id
    hf = transformers.EncoderDecoderModel(config=config)
    missing, unexpected = hf.load_state_dict({k: torch.tensor(v) for k, v in state.items()}, strict=False)
    missing = [k for k in missing if "position_ids" not in k]  # a buffer, not a weight
    if missing or unexpected:
        raise ConversionError(f"transformers' model did not take these weights: missing {missing[:3]}, unexpected {unexpected[:3]}.")
    gen = hf.generation_config
    gen.decoder_start_token_id, gen.eos_token_id, gen.pad_token_id = c.cls_id, c.sep_id, c.pad_id
    return hf.eval()
