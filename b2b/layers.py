"""Transformer blocks: BERT embeddings, attention (fast and explicit paths), feed-forward, and the
post-norm encoder and decoder layers. Shapes: B batch, S source length, T target length,
H heads, D head dim, C hidden size."""
from __future__ import annotations

import math
from typing import Optional

import mlx.core as mx
import mlx.nn as nn

from . import cpu_ops, fastmath
from .cache import LayerCache, StaticLayerCache
from .config import B2BConfig

# A boolean mask (True = may attend), the string "causal", or None.
Mask = Optional[mx.array | str]


class LayerNorm(nn.LayerNorm):
    """nn.LayerNorm (same parameters and results), computed by b2b's C kernel on the CPU where
    it applies (cpu_ops): MLX's composed LayerNorm is ~10x slower there, backward most."""

    def __call__(self, x: mx.array) -> mx.array:
        fused = cpu_ops.layer_norm(x, self.weight, self.bias, self.eps) if "weight" in self and "bias" in self else None
        return fused if fused is not None else super().__call__(x)


class Linear(nn.Linear):
    """nn.Linear (same parameters and results) whose weight gradient is computed in the
    weight's own row-major layout on the CPU (fastmath.linear)."""

    def __call__(self, x: mx.array) -> mx.array:
        return fastmath.linear(x, self.weight, self.bias if "bias" in self else None)


class Dropout(nn.Dropout):
    """nn.Dropout (same probability and expectation; a different random mask for a seed),
    computed by b2b's C kernel on the CPU where it applies (cpu_ops.dropout): a hash of the
    element's index instead of a threefry word per element, and no stored mask."""

    def __call__(self, x: mx.array) -> mx.array:
        if self._p_1 == 1 or not self.training:
            return x
        fused = cpu_ops.dropout(x, 1.0 - self._p_1)
        return fused if fused is not None else super().__call__(x)


class Embeddings(nn.Module):
    """Word + learned position + segment embeddings, then LayerNorm and dropout (BERT)."""

    def __init__(self, cfg: B2BConfig, word: nn.Embedding | None = None):
        super().__init__()
        # The decoder passes the encoder's word table in: one vocabulary, one matrix.
        if word is None:
            self.word = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        else:
            # object.__setattr__ keeps it out of this module's parameters (saved once, by its owner).
            object.__setattr__(self, "_shared_word", word)
        self.position = nn.Embedding(cfg.max_positions, cfg.hidden_size)
        self.token_type = nn.Embedding(cfg.type_vocab_size, cfg.hidden_size)
        self.norm = LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.dropout = Dropout(cfg.dropout)

    @property
    def word_table(self) -> nn.Embedding:
        return self.word if "word" in self else self._shared_word

    def __call__(self, ids: mx.array, token_type_ids: mx.array | None = None, offset: int | mx.array = 0) -> mx.array:
        T = ids.shape[1]
        # `offset` is an int, or a () array when a compiled decoding step serves every position.
        x = self.word_table(ids) + self.position(mx.arange(T) + offset)  # (B, T, C)
        if token_type_ids is None:
            x = x + self.token_type.weight[0]
        else:
            x = x + self.token_type(token_type_ids)
        return self.dropout(self.norm(x))


class Attention(nn.Module):
    """Multi-head attention. The fast path is `fastmath.attention` (on the CPU a fused softmax
    with a flash-style backward; elsewhere mx.fast.scaled_dot_product_attention); the explicit
    path computes the softmax itself so it can also return the weights (B, H, Tq, Tk)."""

    def __init__(self, cfg: B2BConfig):
        super().__init__()
        C = cfg.hidden_size
        self.num_heads = cfg.num_heads
        self.scale = 1.0 / math.sqrt(cfg.head_dim)
        self.query = Linear(C, C)
        self.key = Linear(C, C)
        self.value = Linear(C, C)
        self.out = Linear(C, C)

    def split_heads(self, x: mx.array) -> mx.array:
        B, T, C = x.shape
        return x.reshape(B, T, self.num_heads, C // self.num_heads).transpose(0, 2, 1, 3)  # (B, H, T, D)

    def project_kv(self, x: mx.array) -> tuple[mx.array, mx.array]:
        """Keys and values for a sequence, (B, H, T, D) each: done once per input for cross-attention."""
        return self.split_heads(self.key(x)), self.split_heads(self.value(x))

    def __call__(
        self,
        x: mx.array,
        kv: tuple[mx.array, mx.array],
        mask: Mask = None,
        return_weights: bool = False,
    ) -> tuple[mx.array, mx.array | None]:
        k, v = kv  # (B, H, Tk, D)
        R, T, C = x.shape
        beams = R // k.shape[0]
        if beams > 1:
            # Beam search: R = B * beams rows, one token each, and each input's beams share its
            # cross-attention K/V (held once, not per beam). The beams become the queries of one
            # attention per input: K/V are read once instead of once per beam.
            q = self.query(x).reshape(k.shape[0], beams, self.num_heads, -1).transpose(0, 2, 1, 3)  # (B, H, beams, D)
        else:
            q = self.split_heads(self.query(x))  # (B, H, Tq, D)
        if return_weights:
            out, weights = attention_explicit(q, k, v, self.scale, mask)
            if beams > 1:  # (B, H, beams, Tk) -> (R, H, 1, Tk)
                weights = weights.transpose(0, 2, 1, 3).reshape(R, self.num_heads, 1, -1)
        else:
            out, weights = fastmath.attention(q, k, v, self.scale, mask), None
        out = out.transpose(0, 2, 1, 3).reshape(R, T, C)  # (R, Tq, C)
        return self.out(out), weights


def attention_explicit(q: mx.array, k: mx.array, v: mx.array, scale: float, mask: Mask) -> tuple[mx.array, mx.array]:
    """Reference attention that also returns the softmax weights (B, H, Tq, Tk)."""
    scores = (q * scale) @ k.transpose(0, 1, 3, 2)  # (B, H, Tq, Tk)
    if isinstance(mask, str):  # "causal": query i sees keys 0..i (offset when Tk > Tq, i.e. cached)
        Tq, Tk = scores.shape[-2:]
        mask = mx.arange(Tk)[None, :] <= (mx.arange(Tq)[:, None] + Tk - Tq)
    if mask is not None:
        scores = mx.where(mask, scores, mx.array(-mx.inf, scores.dtype))
    weights = mx.softmax(scores.astype(mx.float32), axis=-1).astype(q.dtype)
    return weights @ v, weights


class FeedForward(nn.Module):
    """BERT's position-wise FFN: Linear, GELU, Linear."""

    def __init__(self, cfg: B2BConfig):
        super().__init__()
        self.up = Linear(cfg.hidden_size, cfg.ffn_size)
        self.down = Linear(cfg.ffn_size, cfg.hidden_size)

    def __call__(self, x: mx.array) -> mx.array:
        return self.down(fastmath.gelu(self.up(x)))


class EncoderLayer(nn.Module):
    """Post-norm BERT block: x = LN(x + SelfAttn(x)); x = LN(x + FFN(x))."""

    def __init__(self, cfg: B2BConfig):
        super().__init__()
        self.self_attn = Attention(cfg)
        self.self_attn_norm = LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.ffn = FeedForward(cfg)
        self.ffn_norm = LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.dropout = Dropout(cfg.dropout)

    def __call__(self, x: mx.array, mask: Mask, return_weights: bool = False) -> tuple[mx.array, mx.array | None]:
        h, w = self.self_attn(x, self.self_attn.project_kv(x), mask, return_weights)
        x = self.self_attn_norm(x + self.dropout(h))
        x = self.ffn_norm(x + self.dropout(self.ffn(x)))
        return x, w  # (B, S, C), (B, H, S, S) | None


class DecoderLayer(nn.Module):
    """Post-norm decoder block: causal self-attention, cross-attention to the encoder output, FFN.

    With BERTShare the self-attention, FFN and their norms come from the encoder layer of the
    same depth (`shared`), so this module owns only the cross-attention and its norm."""

    def __init__(self, cfg: B2BConfig):
        super().__init__()
        if not cfg.share_encoder_decoder:
            self.self_attn = Attention(cfg)
            self.self_attn_norm = LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
            self.ffn = FeedForward(cfg)
            self.ffn_norm = LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.cross_attn = Attention(cfg)
        self.cross_attn_norm = LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.dropout = Dropout(cfg.dropout)

    def __call__(
        self,
        x: mx.array,
        cross_kv: tuple[mx.array, mx.array],
        cross_mask: Mask,
        cache: LayerCache | StaticLayerCache | None = None,
        shared: EncoderLayer | None = None,
        return_weights: bool = False,
    ) -> tuple[mx.array, mx.array | None, mx.array | None]:
        blocks = shared if shared is not None else self
        k, v = blocks.self_attn.project_kv(x)  # (B, H, T, D)
        mask: Mask = "causal"
        if cache is not None:
            k, v = cache.update_and_fetch(k, v)
            mask = cache.self_mask(x.shape[1])  # growing cache: None for one new token
        h, self_w = blocks.self_attn(x, (k, v), mask, return_weights)
        x = blocks.self_attn_norm(x + self.dropout(h))
        h, cross_w = self.cross_attn(x, cross_kv, cross_mask, return_weights)
        x = self.cross_attn_norm(x + self.dropout(h))
        x = blocks.ffn_norm(x + self.dropout(blocks.ffn(x)))
        return x, self_w, cross_w  # (B, T, C), (B, H, T, T), (B, H, T, S)
