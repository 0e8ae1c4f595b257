"""The architecture as one frozen dataclass, saved as `config.json` beside every set of weights."""
from __future__ import annotations

import dataclasses
import json
import logging
import os
from dataclasses import dataclass

from .typecheck import type_problem

log = logging.getLogger(__name__)


class ConfigError(ValueError):
    """An invalid architecture setting."""


@dataclass(frozen=True)
class B2BConfig:
    vocab_size: int = 30522  # bert-base-uncased WordPiece, shipped in b2b/vocab
    hidden_size: int = 256
    encoder_layers: int = 4
    decoder_layers: int = 4
    num_heads: int = 8
    ffn_size: int = 1024  # 4x hidden, as in BERT
    max_positions: int = 512  # BERT's learned position table; longer input is truncated
    dropout: float = 0.1  # hidden and attention dropout, as in BERT
    type_vocab_size: int = 2  # segment A/B for sentence pairs (NSP)
    layer_norm_eps: float = 1e-12  # BERT's value; matters for exact parity with HF weights
    pad_id: int = 0
    unk_id: int = 100
    cls_id: int = 101  # also the decoder's start token, as in Rothe et al. 2020
    sep_id: int = 102  # also the decoder's end-of-summary token
    mask_id: int = 103
    share_encoder_decoder: bool = False  # BERTShare: decoder reuses encoder weights, own cross-attn
    tie_embeddings: bool = True  # LM heads project with the word-embedding matrix
    pointer_generator: bool = False  # copy source tokens (See et al. 2017): b2b/pointer.py

    def __post_init__(self) -> None:
        if problem := type_problem(self):
            raise ConfigError(problem)
        for name in ("vocab_size", "hidden_size", "num_heads", "ffn_size", "max_positions", "type_vocab_size"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be at least 1, got {getattr(self, name)}.")
        if self.encoder_layers < 1 or self.decoder_layers < 0:
            raise ConfigError("encoder_layers must be >= 1 and decoder_layers >= 0.")
        if self.hidden_size % self.num_heads:
            raise ConfigError(
                f"hidden_size ({self.hidden_size}) must be divisible by num_heads ({self.num_heads})."
            )
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"dropout must be in [0, 1), got {self.dropout}.")
        if self.max_positions > 4096:
            raise ConfigError(f"max_positions {self.max_positions} is unreasonably large (BERT uses 512).")
        if self.share_encoder_decoder and self.encoder_layers != self.decoder_layers:
            raise ConfigError("share_encoder_decoder needs encoder_layers == decoder_layers.")
        for name in ("pad_id", "unk_id", "cls_id", "sep_id", "mask_id"):
            if not 0 <= getattr(self, name) < self.vocab_size:
                raise ConfigError(f"{name} {getattr(self, name)} is outside the vocabulary.")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    def replace(self, **changes) -> "B2BConfig":
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "B2BConfig":
        """Build from a dict; unknown keys are ignored with a warning (newer/older files)."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            log.warning("Ignoring unknown config keys: %s", ", ".join(unknown))
        return cls(**{k: v for k, v in data.items() if k in known})

    def save(self, folder: str) -> None:
        with open(os.path.join(folder, "config.json"), "w") as f:
            json.dump(self.to_dict(), f, indent=2)

    @classmethod
    def load(cls, folder: str) -> "B2BConfig":
        path = os.path.join(folder, "config.json")
        if not os.path.isfile(path):
            raise FileNotFoundError(f"No config.json in {folder}.")
        with open(path) as f:
            return cls.from_dict(json.load(f))

    @classmethod
    def preset(cls, name: str, **overrides) -> "B2BConfig":
        """A named architecture: tiny (tests), seed, minilm (the shared MiniLM), base (BERT-base)."""
        if name not in PRESETS:
            raise ConfigError(f"Unknown preset {name!r}; choose one of {', '.join(PRESETS)}.")
        return cls(**{**PRESETS[name], **overrides})


PRESETS: dict[str, dict] = {
    # Tests: 2 layers x 32 dims, a full vocabulary so the real tokenizer works unchanged.
    "tiny": dict(hidden_size=32, encoder_layers=2, decoder_layers=2, num_heads=4, ffn_size=64, max_positions=128),
    "seed": dict(hidden_size=256, encoder_layers=4, decoder_layers=4, num_heads=8, ffn_size=1024),
    "minilm": dict(hidden_size=384, encoder_layers=6, decoder_layers=6, num_heads=12, ffn_size=1536),
    "base": dict(hidden_size=768, encoder_layers=12, decoder_layers=12, num_heads=12, ffn_size=3072),
}
