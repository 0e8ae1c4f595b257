"""Where a run's weights come from: nothing (--preset), a b2b checkpoint, or a Hugging Face BERT."""
from __future__ import annotations

import json
import logging
import os

import mlx.core as mx

from b2b import B2BConfig, Bert2Bert, Tokenizer, load_checkpoint, load_hf_bert
from b2b.convert import resolve_hf_folder

from .checkpoints import list_checkpoints
from .settings import TrainSettings

log = logging.getLogger(__name__)


def copy_encoder_into_decoder(model: Bert2Bert) -> None:
    """Warm-start the decoder from the encoder (Rothe et al. 2020): self-attention, FFN, norms,
    position/segment embeddings and the LM head; cross-attention keeps its fresh weights."""
    if model.config.share_encoder_decoder:
        return  # BERTShare already uses the encoder's weights
    enc, dec = model.encoder, model.decoder
    for d, e in zip(dec.layers, enc.layers):
        for name in ("self_attn", "self_attn_norm", "ffn", "ffn_norm"):
            d[name].update(e[name].parameters())
    for name in ("position", "token_type", "norm"):
        dec.embeddings[name].update(enc.embeddings[name].parameters())
    dec.lm_head.update(enc.mlm_head.parameters())


def init_folder(init: str) -> str | None:
    """The checkpoint folder a local `--init` names (a run folder: its newest checkpoint), or None
    for a hub id or a folder that holds no checkpoint."""
    if not init or not os.path.isdir(init):
        return None
    if os.path.isfile(os.path.join(init, "config.json")):
        return init
    runs = list_checkpoints(init)
    return runs[-1][1] if runs else None


def build_model(s: TrainSettings, share: bool = False, pointer: bool = False) -> tuple[Bert2Bert, Tokenizer]:
    """The model a run starts from. `--init` may name a b2b checkpoint (an MLM-pretrained one
    also warm-starts the decoder from its encoder), a run folder (its newest checkpoint) or a
    Hugging Face BERT folder / hub id. `pointer` adds a pointer-generator; a checkpoint without
    one warm-starts it from its last cross-attention."""
    overrides = {"dropout": s.dropout} if s.dropout >= 0 else {}
    if share:
        overrides["share_encoder_decoder"] = True
    if pointer:
        overrides["pointer_generator"] = True
    if not s.init:
        mx.random.seed(s.seed)
        cfg = B2BConfig.preset(s.preset, **overrides)
        return Bert2Bert(cfg), Tokenizer.default()
    folder = init_folder(s.init) if os.path.isdir(s.init) else resolve_hf_folder(s.init)
    if folder is None:
        raise FileNotFoundError(f"--init {s.init} is neither a checkpoint (no config.json) nor a run folder with checkpoints.")
    if os.path.isdir(s.init) and folder != s.init:
        log.info("--init %s is a run folder: starting from its newest checkpoint, %s.", s.init, folder)
    with open(os.path.join(folder, "config.json")) as f:
        is_hf = "model_type" in json.load(f)
    mx.random.seed(s.seed)  # the fresh parts (cross-attention) are seeded too
    if is_hf:
        log.info("Warm start from the Hugging Face BERT in %s (encoder and decoder).", folder)
        return load_hf_bert(folder, **overrides), Tokenizer.from_pretrained(folder)
    loaded, tokenizer = load_checkpoint(folder)
    model = Bert2Bert(loaded.config.replace(**overrides))
    if model.config.share_encoder_decoder and not loaded.config.share_encoder_decoder:
        model.encoder.update(loaded.encoder.parameters())  # BERTShare keeps only the encoder
    else:
        model.update(loaded.parameters())
    if model.config.pointer_generator and not loaded.config.pointer_generator:
        log.info("Adding a pointer-generator, started from the last decoder layer's cross-attention.")
        model.warm_start_pointer()
    state_path = os.path.join(folder, "trainer_state.json")
    if os.path.isfile(state_path):
        with open(state_path) as f:
            if json.load(f).get("task") == "mlm":
                log.info("Initialising the decoder from the MLM-pretrained encoder of %s.", folder)
                copy_encoder_into_decoder(model)
    return model, tokenizer
