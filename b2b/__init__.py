"""b2b: BERT2BERT encoder-decoder summarization in MLX.

`runtime` is imported first: on Linux it preloads an optimized BLAS before `mlx.core` loads.
"""
from .runtime import runtime_info  # noqa: I001 - must come before anything that imports mlx

from .cache import DecoderCache, LayerCache
from .checkpoint import DECODING_FILE, CheckpointError, dtype_name, is_checkpoint, load_checkpoint, save_checkpoint
from .config import PRESETS, B2BConfig, ConfigError
from .convert import ConversionError, load_hf_bert, to_hf_model
from .generate import DecodingConfig, DecodingError, Hypothesis, generate
from .model import Bert2Bert, Intermediates
from .rouge import RougeResult, lead3, rouge_scores
from .summarize import (
    AttentionMaps, InputError, StreamChunk, SummaryResult, attention_maps, stream_summarize, summarize,
)
from .text import glued_words
from .tokenizer import Tokenizer, TokenizerError

__version__ = "0.1.0"

__all__ = [
    "AttentionMaps", "B2BConfig", "Bert2Bert", "CheckpointError", "ConfigError", "ConversionError", "DECODING_FILE",
    "DecoderCache", "DecodingConfig", "DecodingError", "Hypothesis", "InputError", "Intermediates",
    "LayerCache", "PRESETS", "RougeResult", "StreamChunk", "SummaryResult", "Tokenizer", "TokenizerError",
    "attention_maps", "dtype_name", "generate", "glued_words", "is_checkpoint", "lead3", "load_checkpoint",
    "load_hf_bert", "rouge_scores", "runtime_info", "save_checkpoint", "stream_summarize", "summarize", "to_hf_model",
]
