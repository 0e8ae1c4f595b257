"""A small API over a fast WordPiece tokenizer (`tokenizers`); text clean-up is in `b2b.text`.

Truncation, special tokens and padding are done here in Python, never by switching the Rust
tokenizer's own settings: a `Tokenizer` is then safe to share, and a `tokenizer.json` that was
saved with fixed padding (as some hub models are) cannot silently change our lengths.
"""
from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer as _Backend
from tokenizers import decoders, models, normalizers, pre_tokenizers, processors

from .text import TokenizerError, check_str, detokenize

VOCAB_PATH = Path(__file__).resolve().parent / "vocab" / "vocab.txt"
_ROLES = ("pad", "unk", "cls", "sep", "mask")
_BERT_SPECIALS = {"pad": "[PAD]", "unk": "[UNK]", "cls": "[CLS]", "sep": "[SEP]", "mask": "[MASK]"}


@dataclass
class Encoded:
    ids: list[int]
    truncated: bool
    num_tokens: int  # length before truncation, special tokens included


@dataclass
class BatchEncoding:
    ids: np.ndarray  # (B, T) int32, padded with pad_id
    attention_mask: np.ndarray  # (B, T) int32: 1 real token, 0 padding
    lengths: np.ndarray  # (B,) int32
    truncated: list[bool]
    num_tokens: list[int] = field(default_factory=list)  # before truncation, specials included


def _check_texts(texts: object) -> list[str]:
    if isinstance(texts, str) or not isinstance(texts, (list, tuple)):
        raise TokenizerError(f"texts must be a list of str, got {type(texts).__name__}.")
    for i, t in enumerate(texts):
        check_str(t, f"texts[{i}]")
    return list(texts)


def _check_max_length(max_length: int, minimum: int) -> None:
    if not isinstance(max_length, (int, np.integer)) or max_length < minimum:
        raise TokenizerError(f"max_length must be an int >= {minimum}, got {max_length!r}.")


def _bert_backend(vocab_file: str, lowercase: bool, specials: dict[str, str]) -> _Backend:
    """The BERT WordPiece pipeline (as in bert-base-uncased) built from a vocab.txt."""
    backend = _Backend(models.WordPiece.from_file(vocab_file, unk_token=specials["unk"]))
    backend.normalizer = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True, strip_accents=None, lowercase=lowercase
    )
    backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    backend.decoder = decoders.WordPiece()
    cls, sep = specials["cls"], specials["sep"]
    backend.post_processor = processors.TemplateProcessing(
        single=f"{cls} $A {sep}",
        pair=f"{cls} $A {sep} $B:1 {sep}:1",
        special_tokens=[(cls, backend.token_to_id(cls) or 0), (sep, backend.token_to_id(sep) or 0)],
    )
    # Registered as special so a literal "[MASK]" in text maps to the mask id, as in HF BERT.
    backend.add_special_tokens(list(specials.values()))
    return backend


def _is_lowercase(backend: _Backend) -> bool:
    """Whether the backend's normalizer lowercases (read from its JSON form)."""
    norm = json.loads(backend.to_str()).get("normalizer") or {}
    parts = norm.get("normalizers", [norm])
    return any(p.get("type") == "Lowercase" or p.get("lowercase") is True for p in parts)


def _read_specials(folder: Path) -> tuple[dict[str, str], dict]:
    """Special-token strings and the raw tokenizer_config.json of a folder (BERT defaults)."""
    specials, config = dict(_BERT_SPECIALS), {}
    for name in ("special_tokens_map.json", "tokenizer_config.json"):
        path = folder / name
        if path.is_file():
            data = json.loads(path.read_text(encoding="utf-8"))
            config = data if name == "tokenizer_config.json" else config
            for role in _ROLES:
                value = data.get(f"{role}_token")
                value = value.get("content") if isinstance(value, dict) else value
                if isinstance(value, str):
                    specials[role] = value
    return specials, config


class Tokenizer:
    """WordPiece tokenizer with BERT special tokens; see `default()` and `from_pretrained()`."""

    def __init__(self, backend: _Backend, specials: dict[str, str] | None = None) -> None:
        backend.no_truncation()
        backend.no_padding()
        self._backend = backend
        self.specials = dict(specials or _BERT_SPECIALS)
        for role in _ROLES:
            token_id = backend.token_to_id(self.specials[role])
            if token_id is None:
                raise TokenizerError(f"The vocabulary has no {role} token {self.specials[role]!r}.")
            setattr(self, f"{role}_id", int(token_id))
        self.lowercase = _is_lowercase(backend)
        # [UNK] too, as Hugging Face does: a summary should not show the literal "[UNK]".
        self._skip_ids = {self.pad_id, self.unk_id, self.cls_id, self.sep_id, self.mask_id}

    @property
    def vocab_size(self) -> int:
        return self._backend.get_vocab_size(with_added_tokens=True)

    def token_id(self, token: str) -> int | None:
        """The id of one vocabulary entry, None when it is not in the vocabulary."""
        return self._backend.token_to_id(check_str(token))

    @functools.cached_property
    def continues_word(self) -> np.ndarray:
        """(vocab_size,) bool: True for the pieces that continue the word before them
        (WordPiece's "##" prefix), which decoding needs to tell where words start."""
        prefix = getattr(self._backend.model, "continuing_subword_prefix", None) or "##"
        return np.array([(self._backend.id_to_token(i) or "").startswith(prefix) for i in range(self.vocab_size)])

    @classmethod
    def default(cls) -> "Tokenizer":
        """The bundled bert-base-uncased vocabulary, lowercasing."""
        return cls(_Backend.from_str(_default_backend_json()))

    @classmethod
    def from_pretrained(cls, name_or_path: str) -> "Tokenizer":
        """Load from a folder (tokenizer.json or vocab.txt), a vocab.txt path, or a hub id."""
        check_str(name_or_path, "name_or_path")
        path = Path(name_or_path).expanduser()
        if path.is_dir():
            specials, config = _read_specials(path)
            if (path / "tokenizer.json").is_file():
                return cls(_Backend.from_file(str(path / "tokenizer.json")), specials)
            if (path / "vocab.txt").is_file():
                lower = bool(config.get("do_lower_case", True))
                return cls(_bert_backend(str(path / "vocab.txt"), lower, specials), specials)
            raise TokenizerError(f"No tokenizer.json or vocab.txt in {path}.")
        if path.is_file():
            specials, config = _read_specials(path.parent)
            if path.suffix == ".json":
                return cls(_Backend.from_file(str(path)), specials)
            lower = bool(config.get("do_lower_case", True))
            return cls(_bert_backend(str(path), lower, specials), specials)
        # Hub ids are `name` or `org/name`; anything else that does not exist is a bad path.
        if name_or_path.startswith(("/", ".", "~")) or name_or_path.count("/") > 1 or "\\" in name_or_path:
            raise TokenizerError(f"Tokenizer path {name_or_path} does not exist.")
        return cls._from_hub(name_or_path)

    @classmethod
    def _from_hub(cls, name: str) -> "Tokenizer":
        try:
            from transformers import AutoTokenizer  # lazy: slow import, needed only for hub ids

            hf = AutoTokenizer.from_pretrained(name)
        except (OSError, ValueError, ImportError) as err:
            raise TokenizerError(
                f"Could not load tokenizer {name!r} from a local path or the Hugging Face hub "
                f"(offline, or no such model): {type(err).__name__}."
            ) from err
        if not getattr(hf, "is_fast", False):
            raise TokenizerError(f"Tokenizer {name!r} has no fast (Rust) version.")
        specials = {r: getattr(hf, f"{r}_token", None) or _BERT_SPECIALS[r] for r in _ROLES}
        return cls(_Backend.from_str(hf.backend_tokenizer.to_str()), specials)

    def save(self, folder: str) -> None:
        """Write vocab.txt, tokenizer.json and tokenizer_config.json into `folder`."""
        out = Path(folder)
        out.mkdir(parents=True, exist_ok=True)
        vocab = sorted(self._backend.get_vocab(with_added_tokens=True).items(), key=lambda kv: kv[1])
        (out / "vocab.txt").write_text("".join(tok + "\n" for tok, _ in vocab), encoding="utf-8")
        self._backend.save(str(out / "tokenizer.json"))
        config = {"do_lower_case": self.lowercase, "tokenizer_class": "BertTokenizer"}
        config["model_max_length"] = 512
        config.update({f"{role}_token": self.specials[role] for role in _ROLES})
        (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")

    def tokenize(self, text: str) -> list[str]:
        """WordPiece tokens of `text`, without special tokens."""
        return self._backend.encode(check_str(text), add_special_tokens=False).tokens

    def convert_ids_to_tokens(self, ids) -> list[str]:
        """Token strings of a 1-D sequence of ids (list, numpy or mlx array)."""
        return [self._backend.id_to_token(i) for i in self._id_list(ids)]

    def _id_list(self, ids) -> list[int]:
        try:
            arr = np.asarray(ids)
        except (TypeError, ValueError) as err:
            raise TokenizerError(f"ids must be a 1-D sequence of ints, got {type(ids).__name__}.") from err
        if arr.ndim != 1 or (arr.size and not np.issubdtype(arr.dtype, np.integer)):
            raise TokenizerError(f"ids must be a 1-D sequence of ints, got shape {arr.shape} {arr.dtype}.")
        if arr.size and (arr.min() < 0 or arr.max() >= self.vocab_size):
            raise TokenizerError(f"ids must lie in [0, {self.vocab_size}), got {arr.min()}..{arr.max()}.")
        return arr.astype(np.int64).tolist()

    def _wrap(self, ids: list[int], max_length: int, add_special_tokens: bool) -> Encoded:
        """Truncate and add [CLS] ... [SEP]; the [SEP] always survives truncation."""
        if not add_special_tokens:
            return Encoded(ids[:max_length], len(ids) > max_length, len(ids))
        body = ids[: max_length - 2]
        return Encoded([self.cls_id, *body, self.sep_id], len(ids) + 2 > max_length, len(ids) + 2)

    def encode(self, text: str, max_length: int = 512, add_special_tokens: bool = True) -> Encoded:
        """Ids of `[CLS] text [SEP]`, truncated to `max_length` (the result says if it was)."""
        _check_max_length(max_length, 2 if add_special_tokens else 1)
        ids = self._backend.encode(check_str(text), add_special_tokens=False).ids
        return self._wrap(ids, max_length, add_special_tokens)

    def encode_pair(self, a: str, b: str, max_length: int = 512) -> tuple[list[int], list[int]]:
        """Ids and segment ids of `[CLS] a [SEP] b [SEP]`, truncating the longer side first."""
        _check_max_length(max_length, 3)
        pair = [check_str(a, "a"), check_str(b, "b")]
        ia, ib = (e.ids for e in self._backend.encode_batch(pair, add_special_tokens=False))
        budget = max_length - 3
        if len(ia) + len(ib) > budget:
            # Same result as removing one token at a time from the longer side (a keeps ties).
            half = budget // 2
            if len(ia) <= half:
                ib = ib[: budget - len(ia)]
            elif len(ib) <= half:
                ia = ia[: budget - len(ib)]
            else:
                ia, ib = ia[: budget - half], ib[:half]
        ids = [self.cls_id, *ia, self.sep_id, *ib, self.sep_id]
        return ids, [0] * (len(ia) + 2) + [1] * (len(ib) + 1)

    def batch_encode(
        self, texts: list[str], max_length: int = 512, add_special_tokens: bool = True
    ) -> BatchEncoding:
        """Encode many texts at once (Rust, multi-threaded) and pad to the longest."""
        _check_max_length(max_length, 2 if add_special_tokens else 1)
        encs = [self._wrap(ids, max_length, add_special_tokens) for ids in self.encode_plain(texts)]
        lengths = np.array([len(e.ids) for e in encs], dtype=np.int32)
        ids = np.full((len(encs), int(lengths.max(initial=0))), self.pad_id, dtype=np.int32)
        for row, e in zip(ids, encs):
            row[: len(e.ids)] = e.ids
        mask = (np.arange(ids.shape[1])[None, :] < lengths[:, None]).astype(np.int32)  # (B, T)
        return BatchEncoding(ids, mask, lengths, [e.truncated for e in encs], [e.num_tokens for e in encs])

    def encode_plain(self, texts: list[str]) -> list[list[int]]:
        """Ids of each text, no special tokens, no truncation (for data pipelines)."""
        return [e.ids for e in self._backend.encode_batch_fast(_check_texts(texts), add_special_tokens=False)]

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        """Readable text: `##` pieces joined, [CLS]/[SEP]/[PAD]/[MASK]/[UNK] dropped, `detokenize`d."""
        id_list = self._id_list(ids)
        if skip_special_tokens:
            id_list = [i for i in id_list if i not in self._skip_ids]
        words: list[str] = []
        for tok in (self._backend.id_to_token(i) for i in id_list):
            if tok.startswith("##") and words:
                words[-1] += tok[2:]
            else:
                words.append(tok)
        return detokenize(" ".join(words))


@functools.lru_cache(maxsize=1)
def _default_backend_json() -> str:
    # Building from vocab.txt takes ~0.1 s; keep the JSON so each default() is a cheap copy.
    return _bert_backend(str(VOCAB_PATH), True, _BERT_SPECIALS).to_str()
