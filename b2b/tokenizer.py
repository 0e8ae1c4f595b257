"""A small API over a fast WordPiece tokenizer (`tokenizers`), plus text clean-up helpers.

Truncation, special tokens and padding are done here in Python, never by switching the Rust
tokenizer's own settings: a `Tokenizer` is then safe to share, and a `tokenizer.json` that was
saved with fixed padding (as some hub models are) cannot silently change our lengths.
"""
from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer as _Backend
from tokenizers import decoders, models, normalizers, pre_tokenizers, processors

VOCAB_PATH = Path(__file__).resolve().parent / "vocab" / "vocab.txt"
_ROLES = ("pad", "unk", "cls", "sep", "mask")
_BERT_SPECIALS = {"pad": "[PAD]", "unk": "[UNK]", "cls": "[CLS]", "sep": "[SEP]", "mask": "[MASK]"}


class TokenizerError(ValueError):
    """Bad input to the tokenizer, or a tokenizer that cannot be found or loaded."""


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


def _check_str(text: object, what: str = "text") -> str:
    if not isinstance(text, str):
        raise TokenizerError(f"{what} must be a str, got {type(text).__name__}.")
    return text


def _check_texts(texts: object) -> list[str]:
    if isinstance(texts, str) or not isinstance(texts, (list, tuple)):
        raise TokenizerError(f"texts must be a list of str, got {type(texts).__name__}.")
    for i, t in enumerate(texts):
        _check_str(t, f"texts[{i}]")
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

    @classmethod
    def default(cls) -> "Tokenizer":
        """The bundled bert-base-uncased vocabulary, lowercasing."""
        return cls(_Backend.from_str(_default_backend_json()))

    @classmethod
    def from_pretrained(cls, name_or_path: str) -> "Tokenizer":
        """Load from a folder (tokenizer.json or vocab.txt), a vocab.txt path, or a hub id."""
        _check_str(name_or_path, "name_or_path")
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
        return self._backend.encode(_check_str(text), add_special_tokens=False).tokens

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
        ids = self._backend.encode(_check_str(text), add_special_tokens=False).ids
        return self._wrap(ids, max_length, add_special_tokens)

    def encode_pair(self, a: str, b: str, max_length: int = 512) -> tuple[list[int], list[int]]:
        """Ids and segment ids of `[CLS] a [SEP] b [SEP]`, truncating the longer side first."""
        _check_max_length(max_length, 3)
        pair = [_check_str(a, "a"), _check_str(b, "b")]
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


# ---- text clean-up: PTB / WordPiece token streams -> readable text --------------------------

# Words whose trailing period does not end a sentence.
_ABBREVIATIONS = frozenset(
    "mr mrs ms dr prof st jr sr vs gen sen rep gov lt col sgt capt cpl maj adm mt ft rev "
    "jan feb mar apr aug sep sept oct nov dec inc ltd co corp dept est approx".split()
)
_KEEP_LOWER = frozenset({"i.e.", "e.g.", "a.m.", "p.m."})
_UPPER_WORDS = {w: w.upper() for w in ("cnn", "fbi", "cia", "nasa", "bbc", "nfl", "nba")}
_UPPER_RE = re.compile(r"(?<![@.])\b(" + "|".join(_UPPER_WORDS) + r")\b(?!\.\w)", re.I)
_GLUE_LEFT = frozenset(". , ; : ! ? % ) ] } ... n't 's 're 've 'll 'd 'm ” ’".split())
_GLUE_RIGHT = frozenset("( [ { $ # “ ‘ `".split())  # curly and PTB (`) quotes say which side they are
_GLUE_BOTH = frozenset("- / @".split())
# A straight quote just before one of these closes; one after an opening bracket opens.
_QUOTE_CLOSERS = frozenset(". , ; : ! ? ) ] }".split())
# Words ending in s that are not plural nouns: a ' after them opens a quote, not a possessive.
_NOT_PLURALS = frozenset("was is has does says his its this us as yes thus plus always perhaps".split())
_DECADE = re.compile(r"\d\ds?$")  # the '90s, '99: an elided century
_REPLACEMENTS = [
    (re.compile(r" @([-,.])@ "), r"\1"),  # WikiText's Moses escapes: 1 @,@ 000, well @-@ known
    (re.compile(r" (?:``|''|` `|' ') "), ' " '),  # PTB double quotes, also as WordPiece splits them
    (re.compile(r" - - "), " -- "),
    (re.compile(r"(\w)n ' t\b", re.I), r"\1 n't"),  # WordPiece splits "didn't" as didn ' t
    (re.compile(r" n ' t\b", re.I), " n't"),
    (re.compile(r"(?<=[\w.]) ' (s|re|ve|ll|d|m)\b", re.I), r" '\1"),  # u . n . ' s too
    (re.compile(r"(?<=\w) ’ (?=(?:s|t|re|ve|ll|d|m)\b)", re.I), "’"),  # curly apostrophes: don ’ t
    (re.compile(r"(?<!\S)([odl]) ' (?=\w)", re.I), r"\1'"),  # o'brien, d'angelo, l'oreal
    (re.compile(r"\b(gon|wan) na\b", re.I), r"\1na"),  # PTB splits gonna / wanna
    (re.compile(r"(?<=\d) , (?=\d{3}\b)"), ","),  # 1 , 000
    (re.compile(r"(?<=\d) ([.:]) (?=\d)"), r"\1"),  # 3 . 5, 10 : 30
    (re.compile(r"\. \. \."), "..."),
    (re.compile(r"(?<=\w) \. (?=(?:com|org|net|gov|edu)\b)"), "."),  # cnn . com
    (re.compile(r"(?<!\S)((?:[a-z] \. ){2,})", re.I), lambda m: m.group(1).replace(" ", "") + " "),
    (re.compile(r"(?<=\w\.) \.(?!\.)"), ""),  # PTB ends "at 10 a.m. ." with a second period
]
_SENT_END = re.compile(r"([.!?])([\"'”’)\]]*)(\s+)([\"'“‘(\[]*)([a-z])")


def _quote_role(tok: str, prev: str, nxt: str, is_open: bool, next_closes: bool) -> str:
    """What a straight quote is: "open", "close", "mark" (glued to the word before: players',
    6'2"), "elide" (glued to the word after: the '90s) or "join" (6'2). Parity alone flips
    every later pair after one stray quote, so the neighbours decide wherever they can;
    `next_closes`: the next " is certainly a closing one."""
    if nxt in _QUOTE_CLOSERS:
        return "close"
    if not prev or prev in _GLUE_RIGHT:
        return "open"
    if tok == '"' and is_open and next_closes:
        return "open"  # the open one before was stray: this one opens what the next closes
    after_digit = prev[-1].isdigit()
    if tok == "'":
        if after_digit and nxt[:1].isdigit():
            return "join"
        if not is_open and _DECADE.match(nxt) and not after_digit:
            return "elide"
        if not is_open and prev[-1].lower() == "s" and prev.lower() not in _NOT_PLURALS:
            return "mark"
    elif not is_open and after_digit:
        return "mark"  # inches
    return "close" if is_open else "open"


def _glue(tokens: list[str]) -> str:
    """Join tokens, attaching punctuation and pairing quotes (open: glue right, close: left)."""
    out, glue_next, is_open = "", True, {'"': False, "'": False}
    doubles = [i for i, t in enumerate(tokens) if t == '"']
    # Single quotes get no look-ahead: a possessive (the players') before a comma looks like a close.
    next_double = dict(zip(doubles, doubles[1:]))
    for i, tok in enumerate(tokens):
        left = tok in _GLUE_LEFT or tok.lower() in _GLUE_LEFT or tok in _GLUE_BOTH
        right = tok in _GLUE_RIGHT or tok in _GLUE_BOTH
        if tok in is_open:
            j = next_double.get(i)
            next_closes = j is not None and j + 1 < len(tokens) and tokens[j + 1] in _QUOTE_CLOSERS
            nxt = tokens[i + 1] if i + 1 < len(tokens) else ""
            role = _quote_role(tok, tokens[i - 1] if i else "", nxt, is_open[tok], next_closes)
            left, right = role in ("close", "mark", "join"), role in ("open", "elide", "join")
            if role in ("open", "close"):
                is_open[tok] = role == "open"
        elif tok in ("`", "‘"):  # a PTB / curly opening single quote: the next ' closes it
            is_open["'"] = True
        out += tok if (glue_next or left) else " " + tok
        glue_next = right
    return out


def _ends_sentence(before: str) -> bool:
    """Whether the period that ends `before` ends a sentence (not `mr.`, `u.s.`, `j.`)."""
    words = before.rsplit(None, 1)
    word = words[-1].rstrip(".").lower() if words else ""
    return word not in _ABBREVIATIONS and not re.search(r"(^|\.)[a-z]$", word)


def _capitalize(text: str) -> str:
    """Upper-case the first letter of the text and of each sentence, plus I, CNN and acronyms."""
    def after_stop(m: re.Match) -> str:
        if m.group(1) == "." and not _ends_sentence(m.string[: m.start() + 1]):
            return m.group(0)
        if m.group(1) in "?!" and re.search("[\"'”’]", m.group(2)):
            return m.group(0)  # `"why?" he asked`: the quote ends, the sentence goes on
        return m.group(1) + m.group(2) + m.group(3) + m.group(4) + m.group(5).upper()

    def acronym(m: re.Match) -> str:
        return m.group(0) if m.group(0).lower() in _KEEP_LOWER else m.group(0).upper()

    text = re.sub(r"\b(?:[a-z]\.){2,}", acronym, text, flags=re.I)
    text = _SENT_END.sub(after_stop, text)
    text = re.sub(r"^([^\w]*)([a-z])", lambda m: m.group(1) + m.group(2).upper(), text)
    text = re.sub(r"(?<![\w.\-])i(?![\w\-]|\.\w)", "I", text)
    text = re.sub(r"\b(mrs?|ms|dr)\.", lambda m: m.group(0).title(), text)
    return _UPPER_RE.sub(lambda m: _UPPER_WORDS[m.group(1).lower()], text)


def detokenize(text: str) -> str:
    """Readable text from PTB/WordPiece-spaced lowercase text: `the man 's dog did n't go .`
    becomes `The man's dog didn't go.`; lines are cleaned separately."""
    lines = []
    for line in _check_str(text).split("\n"):
        line = " " + " ".join(line.split()) + " "
        for pattern, repl in _REPLACEMENTS:
            line = pattern.sub(repl, line)
        lines.append(_capitalize(_glue(line.split())))
    return "\n".join(lines)


_SPLIT = re.compile(r"(?<=[.!?])[\"'’”)\]]*(?=\s)|\n")
_LOWER_NEXT = re.compile(r"\s+[a-z]")
_PTB_CLOSE_QUOTE = re.compile(r"[ \t]+(?:\"|'')(?=\s|$)")


def split_sentences(text: str) -> list[str]:
    """Split at . ! ? (+ closing quotes) before whitespace, and at newlines; not after
    abbreviations or initials. Works on raw and on PTB-tokenized (spaced) text."""
    sentences, start = [], 0
    cased = _check_str(text) != text.lower()  # then a lowercase next word goes on: `"Hi!" she said`
    for m in _SPLIT.finditer(text):
        end = m.end()
        if end <= start:
            continue
        if m.group(0) != "\n":
            if text[m.start() - 1] == "." and not _ends_sentence(text[start : m.start()]):
                continue
            if cased and _LOWER_NEXT.match(text, end):
                continue
        # PTB spaces the closing quote off: `... floor . " here`; an odd quote count means it is ours.
        quote = _PTB_CLOSE_QUOTE.match(text, end)
        if quote and (text.count('"', start, end) + text.count("''", start, end)) % 2:
            end = quote.end()
        sentences.append(text[start:end].strip())
        start = end
    sentences.append(text[start:].strip())
    return [s for s in sentences if s]
