"""BERT2BERT: a BERT encoder (with MLM and NSP heads) and a BERT-style decoder with causal
self-attention and cross-attention, LM head tied to the word embeddings.
Shapes: B batch, S source length, T target length, C hidden, V vocabulary, H heads."""
from __future__ import annotations

from dataclasses import dataclass, field

import mlx.core as mx
import mlx.nn as nn

from . import fastmath
from .cache import DecoderCache, LayerCache
from .config import B2BConfig
from .layers import DecoderLayer, Embeddings, EncoderLayer, LayerNorm, Linear
from .pointer import PointerGenerator, copyable, mix_log_probs


@dataclass
class Intermediates:
    """Attention maps, one (B, H, Tq, Tk) array per layer, when asked for."""

    encoder: list[mx.array] = field(default_factory=list)  # (B, H, S, S)
    decoder: list[mx.array] = field(default_factory=list)  # (B, H, T, T)
    cross: list[mx.array] = field(default_factory=list)  # (B, H, T, S)


def padding_mask(attention_mask: mx.array | None) -> mx.array | None:
    """(B, S) 1/0 -> (B, 1, 1, S) bool, broadcast over heads and queries."""
    if attention_mask is None:
        return None
    return (attention_mask > 0)[:, None, None, :]


class LMHead(nn.Module):
    """BERT's prediction head: Linear + GELU + LayerNorm, then a projection onto the vocabulary
    (the word-embedding matrix when tied) plus a bias."""

    def __init__(self, cfg: B2BConfig):
        super().__init__()
        self.transform = Linear(cfg.hidden_size, cfg.hidden_size)
        self.norm = LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        if not cfg.tie_embeddings:
            self.projection = Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.bias = mx.zeros((cfg.vocab_size,))

    def __call__(self, h: mx.array, word: nn.Embedding, table_t: mx.array | None = None) -> mx.array:
        """Logits (..., V); `table_t`, a contiguous (C, V) copy of the output matrix, is what
        decoding passes: one row times a transposed (V, C) matrix runs ~2x slower in CPU BLAS."""
        h = self.features(h)  # (..., C)
        if table_t is not None:
            return h @ table_t + self.bias
        if "projection" in self:
            return self.projection(h) + self.bias
        return word.as_linear(h) + self.bias  # (..., V)

    def features(self, h: mx.array) -> mx.array:
        """The states the vocabulary projection reads (..., C): Linear + GELU + LayerNorm."""
        return self.norm(fastmath.gelu(self.transform(h)))

    def output_matrix(self, word: nn.Embedding) -> mx.array:
        """The (V, C) matrix the logits are products with: the word table when tied."""
        return self.projection.weight if "projection" in self else word.weight


class Encoder(nn.Module):
    """BERT: embeddings and post-norm blocks, plus the MLM head, pooler and NSP classifier."""

    def __init__(self, cfg: B2BConfig):
        super().__init__()
        self.embeddings = Embeddings(cfg)
        self.layers = [EncoderLayer(cfg) for _ in range(cfg.encoder_layers)]
        self.mlm_head = LMHead(cfg)
        self.pooler = Linear(cfg.hidden_size, cfg.hidden_size)
        self.nsp_head = Linear(cfg.hidden_size, 2)

    def __call__(
        self,
        ids: mx.array,
        attention_mask: mx.array | None = None,
        token_type_ids: mx.array | None = None,
        intermediates: Intermediates | None = None,
    ) -> mx.array:
        mask = padding_mask(attention_mask)
        x = self.embeddings(ids, token_type_ids)  # (B, S, C)
        for layer in self.layers:
            x, w = layer(x, mask, return_weights=intermediates is not None)
            if intermediates is not None:
                intermediates.encoder.append(w)
        return x

    def mlm_logits(self, h: mx.array) -> mx.array:
        """Vocabulary logits for hidden states; pass only the masked positions (N, C) -> (N, V):
        the projection and its softmax are the most expensive part of MLM on a CPU."""
        return self.mlm_head(h, self.embeddings.word)

    def nsp_logits(self, h: mx.array) -> mx.array:
        """Is-next-sentence logits from the [CLS] state: (B, S, C) -> (B, 2)."""
        return self.nsp_head(mx.tanh(self.pooler(h[:, 0])))


class Decoder(nn.Module):
    """BERT-style decoder: embeddings (word table shared with the encoder), blocks with causal
    self-attention and cross-attention, LM head tied to the word embeddings."""

    def __init__(self, cfg: B2BConfig, encoder: Encoder):
        super().__init__()
        if not cfg.share_encoder_decoder:
            self.embeddings = Embeddings(cfg, word=encoder.embeddings.word)
            self.lm_head = LMHead(cfg)
        self.layers = [DecoderLayer(cfg) for _ in range(cfg.decoder_layers)]


class Bert2Bert(nn.Module):
    """The encoder-decoder. `encode` once, then `decode` (teacher forcing) or
    `make_cache` + `decode_step` (generation)."""

    def __init__(self, cfg: B2BConfig):
        super().__init__()
        self.config = cfg
        # Source tokens it was trained to read (a checkpoint's decoding.json): summarize() reads as
        # many by default, since a model trained on 320 summarizes worse from 512. None: all positions.
        self.trained_source_length: int | None = None
        self.encoder = Encoder(cfg)
        self.decoder = Decoder(cfg, self.encoder)
        if cfg.pointer_generator:
            self.pointer = PointerGenerator(cfg)
        self.apply_to_modules(_init_bert)
        self.warm_start_pointer()

    @property
    def source_limit(self) -> int:
        """Source tokens decoding reads by default: the trained length, else every position."""
        return min(self.trained_source_length or self.config.max_positions, self.config.max_positions)

    def warm_start_pointer(self) -> None:
        """Start the pointer from the last decoder layer's cross-attention (after weights from
        a checkpoint without one are loaded, call it again). No-op without a pointer."""
        if "pointer" in self and self.decoder.layers:
            cross = self.decoder.layers[-1].cross_attn
            self.pointer.warm_start(cross.query, cross.key)

    # -- parts shared with BERTShare -------------------------------------------------------
    def _dec_embeddings(self) -> Embeddings:
        return self.encoder.embeddings if self.config.share_encoder_decoder else self.decoder.embeddings

    def _dec_lm_head(self) -> LMHead:
        return self.encoder.mlm_head if self.config.share_encoder_decoder else self.decoder.lm_head

    def _shared_layers(self) -> list[EncoderLayer | None]:
        if self.config.share_encoder_decoder:
            return list(self.encoder.layers)
        return [None] * len(self.decoder.layers)

    # -- forward passes --------------------------------------------------------------------
    def encode(
        self, src_ids: mx.array, src_mask: mx.array | None = None, intermediates: Intermediates | None = None
    ) -> mx.array:
        """Source ids (B, S) and 1/0 mask (B, S) -> encoder states (B, S, C)."""
        return self.encoder(src_ids, src_mask, intermediates=intermediates)

    def decode(
        self,
        tgt_ids: mx.array,
        memory: mx.array,
        src_mask: mx.array | None = None,
        cache: DecoderCache | None = None,
        intermediates: Intermediates | None = None,
    ) -> mx.array:
        """Decoder hidden states (B, T, C) for target ids (B, T) given encoder states (B, S, C).
        Without a cache, cross-attention K/V are projected here; with one, they come from it."""
        want = intermediates is not None
        offset = cache.offset if cache is not None else 0
        cross_mask = cache.cross_mask if cache is not None else padding_mask(src_mask)
        x = self._dec_embeddings()(tgt_ids, offset=offset)  # (B, T, C)
        for i, (layer, shared) in enumerate(zip(self.decoder.layers, self._shared_layers())):
            layer_cache = cache.layers[i] if cache is not None else None
            cross_kv = layer_cache.cross_kv if layer_cache is not None else layer.cross_attn.project_kv(memory)
            x, self_w, cross_w = layer(x, cross_kv, cross_mask, layer_cache, shared, return_weights=want)
            if want:
                intermediates.decoder.append(self_w)
                intermediates.cross.append(cross_w)
        return x

    def lm_logits(self, h: mx.array, table_t: mx.array | None = None) -> mx.array:
        """Decoder states (..., C) -> vocabulary logits (..., V). Pass only the rows you need;
        `table_t` is an optional (C, V) copy of `output_matrix()` (faster for few rows)."""
        return self._dec_lm_head()(h, self.encoder.embeddings.word, table_t)

    def output_matrix(self) -> mx.array:
        """The decoder's (V, C) output matrix (the shared word table unless untied)."""
        return self._dec_lm_head().output_matrix(self.encoder.embeddings.word)

    def lm_projection(self, h: mx.array) -> tuple[mx.array, mx.array, mx.array]:
        """lm_logits in parts, for losses that never form the logits: (features (..., C),
        matrix (V, C), bias (V,)) with logits == features @ matrix.T + bias."""
        head = self._dec_lm_head()
        return head.features(h), head.output_matrix(self.encoder.embeddings.word), head.bias

    def __call__(self, src_ids: mx.array, src_mask: mx.array, tgt_ids: mx.array) -> mx.array:
        """Teacher-forced vocabulary logits (B, T, V) (with a pointer, the vocabulary part
        only: `log_probs` gives the whole distribution)."""
        return self.lm_logits(self.decode(tgt_ids, self.encode(src_ids, src_mask), src_mask))

    def log_probs(self, src_ids: mx.array, src_mask: mx.array, tgt_ids: mx.array) -> mx.array:
        """Teacher-forced log-probabilities of the next token (B, T, V), float32: the
        vocabulary's, mixed with copying from the source when the model has a pointer."""
        memory = self.encode(src_ids, src_mask)
        h = self.decode(tgt_ids, memory, src_mask)  # (B, T, C)
        out = fastmath.log_softmax(self.lm_logits(h).astype(mx.float32))
        if "pointer" not in self:
            return out
        weights, gate = self.point(h, memory, src_ids)
        return mix_log_probs(out, weights, gate, src_ids)

    def point(self, h: mx.array, memory: mx.array, src_ids: mx.array) -> tuple[mx.array, mx.array]:
        """The pointer's copy weights (B, T, S) and gate logits (B, T) for decoder states
        (B, T, C) over encoder states (B, S, C) of source ids (B, S)."""
        return self.pointer(h, self.pointer.keys(memory), memory, copyable(src_ids, self.config))

    # -- generation ------------------------------------------------------------------------
    def make_cache(self, memory: mx.array, src_mask: mx.array | None = None) -> DecoderCache:
        """Project cross-attention K/V once per input; self-attention K/V start empty."""
        # Contiguous once here: the (B, H, S, D) views of project_kv would be copied at every step.
        layers = [LayerCache(tuple(mx.contiguous(a) for a in layer.cross_attn.project_kv(memory)))
                  for layer in self.decoder.layers]
        return DecoderCache(layers, padding_mask(src_mask))

    def decode_step(self, tokens: mx.array, cache: DecoderCache, table_t: mx.array | None = None) -> mx.array:
        """Next-token vocabulary logits (B, V) for the newest tokens (B, 1), extending the cache."""
        return self.decode_step_states(tokens, cache, table_t)[0]

    def decode_step_states(
        self, tokens: mx.array, cache: DecoderCache, table_t: mx.array | None = None
    ) -> tuple[mx.array, mx.array]:
        """`decode_step`'s logits (B, V) and the decoder's final states (B, C) they came
        from (what the pointer reads)."""
        h = self.decode(tokens, None, cache=cache)[:, -1]  # (B, C)
        return self.lm_logits(h, table_t), h

    def num_parameters(self) -> int:
        from mlx.utils import tree_flatten

        return sum(v.size for _, v in tree_flatten(self.parameters()))


def _init_bert(_: str, module: nn.Module) -> None:
    """BERT's initialisation: N(0, 0.02) weights, zero biases, unit LayerNorm."""
    if isinstance(module, (nn.Linear, nn.Embedding)):
        module.weight = mx.random.normal(module.weight.shape) * 0.02
        if "bias" in module:
            module.bias = mx.zeros_like(module.bias)
    elif isinstance(module, nn.LayerNorm):
        module.weight = mx.ones_like(module.weight)
        module.bias = mx.zeros_like(module.bias)
