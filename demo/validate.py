"""Input checks at the app's boundary: text, uploaded files, decoding settings.

Every problem raises `BadInput` (a ValueError) with one sentence a person can act on; the tabs
turn it into `gr.Error` (see `demo.ui_errors`) and the CLI prints it. No gradio here, so the
CLI and the tests use the same checks."""
from __future__ import annotations

import csv
import gzip
import json
import os

from b2b import DecodingConfig

MAX_TEXT_BYTES = 1_000_000  # the model reads a few hundred tokens (~2,500 characters); 1 MB is never an article
# Text past this many characters per position is never read: a word piece is rarely longer, so
# it is cut before tokenizing (a pasted megabyte would otherwise take seconds to tokenize).
CHARS_PER_POSITION = 20
MAX_DATA_BYTES = 200_000_000
TEXT_SUFFIXES = (".txt", ".md")
DATA_SUFFIXES = (".jsonl", ".json", ".csv", ".jsonl.gz")
_HEAD_BYTES = 1 << 20  # how much of a data file is checked up front
STRATEGIES = ("beam", "greedy", "sampling")
MAX_NEW_TOKENS = 512
MAX_BEAMS = 16
SUMMARIZE_DEFAULTS = dict(
    strategy="beam", num_beams=4, length_penalty=1.0, no_repeat_ngram_size=3, min_length=10,
    max_length=128, temperature=1.0, top_k=50, top_p=0.95, seed=-1, repetition_penalty=1.0, no_repeat_word=True,
    coverage_penalty=DecodingConfig.coverage_penalty,  # the library's, chosen on validation articles
    source_spelling=DecodingConfig.source_spelling,
)
# ROUGE over many articles on a CPU: greedy keeps it to seconds per batch.
EVAL_DEFAULTS = dict(SUMMARIZE_DEFAULTS, strategy="greedy", num_beams=1)
DECODING_FIELDS = tuple(SUMMARIZE_DEFAULTS)  # the order of decoding_kwargs' parameters


class BadInput(ValueError):
    """Input the app refuses; the message is one sentence for the user."""


def _megabytes(n: int) -> str:
    return f"{n / 1e6:.1f} MB"


def check_text(text: object, max_positions: int | None = None) -> str:
    """The text to summarize, or BadInput for empty, binary or oversized text; the message
    names the model's input size (`max_positions` tokens) when it is given."""
    if text is None or (isinstance(text, str) and not text.strip()):
        raise BadInput("There is no text to summarize: paste an article or upload a .txt or .md file.")
    if not isinstance(text, str):
        raise BadInput(f"The text must be a string, not {type(text).__name__}.")
    size = len(text.encode("utf-8", errors="replace"))
    if size >= MAX_TEXT_BYTES:
        reads = f"its first {max_positions} tokens" if max_positions else "the start of it"
        raise BadInput(
            f"The text is {_megabytes(size)}, over the 1 MB limit; the model reads only {reads}, "
            "so paste a single article."
        )
    if "\x00" in text:
        raise BadInput("The text contains NUL characters, so it looks like binary data: paste plain text.")
    return text


def clip_text(text: str, max_positions: int) -> str:
    """`text` cut to about CHARS_PER_POSITION x `max_positions` characters (at a space where
    there is one), the most the model could read of it; shorter text is returned unchanged."""
    limit = CHARS_PER_POSITION * max_positions
    if len(text) <= limit:
        return text
    head = text[:limit]
    space = max(head.rfind(" "), head.rfind("\n"), head.rfind("\t"))
    return head[:space] if space > limit // 2 else head


def readable_text(text: object, max_positions: int | None) -> tuple[str, str]:
    """(the checked text, the part of it worth tokenizing): `check_text`, then `clip_text` when
    the model's input size is known. Both the app and the CLI summarize what this returns."""
    text = check_text(text, max_positions)
    return text, clip_text(text, max_positions) if max_positions else text


def _name(path: str) -> str:
    return os.path.basename(path)


def read_text_file(path: str | None, uploaded: bool = True) -> str:
    """The UTF-8 text of a file, or BadInput saying why not (binary, not UTF-8, empty, 1 MB or
    more). An upload must be a .txt or .md file and is named by its base name (its temporary
    path means nothing to the user); a path the user typed may have any name and is named as typed."""
    if not path:
        raise BadInput("No file was given.")
    name = _name(path) if uploaded else path
    if not uploaded:
        path = os.path.expanduser(path)  # `>file ~/a.txt` at the CLI's prompt: no shell expands it
    if uploaded and not path.lower().endswith(TEXT_SUFFIXES):
        raise BadInput(f"{name} is not a .txt or .md file; only plain text can be summarized.")
    try:
        size = os.path.getsize(path)
        if size >= MAX_TEXT_BYTES:
            raise BadInput(f"{name} is {_megabytes(size)}, over the 1 MB limit; use a single article.")
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise BadInput(f"Could not read {name} ({e.strerror or e}).") from None
    if b"\x00" in raw:
        raise BadInput(f"{name} looks like a binary file, not text; use a UTF-8 .txt or .md file.")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise BadInput(f"{name} is not UTF-8 text; save it as UTF-8 and try again.") from None
    if not text.strip():
        raise BadInput(f"{name} is empty.")
    return check_text(text)


def check_data_file(path: str | None) -> str:
    """An uploaded JSONL/JSON/CSV file of article-reference pairs that is readable UTF-8 text."""
    if not path:
        raise BadInput("Upload a .jsonl or .csv file first, or choose the bundled sample set.")
    name = _name(path)
    if not path.lower().endswith(DATA_SUFFIXES):
        raise BadInput(f"{name} is not a .jsonl, .json or .csv file.")
    try:
        size = os.path.getsize(path)
        if size == 0:
            raise BadInput(f"{name} is empty.")
        if size > MAX_DATA_BYTES:
            raise BadInput(f"{name} is {_megabytes(size)}, over the {_megabytes(MAX_DATA_BYTES)} limit.")
        opener = gzip.open if path.lower().endswith(".gz") else open
        with opener(path, "rb") as f:
            head = f.read(_HEAD_BYTES)
    except (OSError, EOFError) as e:  # gzip.BadGzipFile is an OSError
        raise BadInput(f"Could not read {name} ({getattr(e, 'strerror', None) or e}).") from None
    if b"\x00" in head:
        raise BadInput(f"{name} looks like a binary file, not JSONL or CSV text.")
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as e:
        if len(head) < _HEAD_BYTES or e.start < len(head) - 4:  # not a character cut at the boundary
            raise BadInput(f"{name} is not UTF-8 text; save it as UTF-8 and upload it again.") from None
    return path


def data_fields(path: str) -> list[str]:
    """Field names of a pairs file (CSV header, or the keys of the first JSON object)."""
    check_data_file(path)
    name = _name(path)
    opener = gzip.open if path.lower().endswith(".gz") else open
    try:
        # utf-8-sig: a spreadsheet's CSV export starts with a byte-order mark, not part of the name
        with opener(path, "rt", encoding="utf-8-sig", newline="") as f:
            if path.lower().endswith(".csv"):
                header = next(csv.reader(f), None)
                if not header:
                    raise BadInput(f"{name} has no header row naming its columns.")
                return [h for h in header if h]
            for line in f:
                if line.strip():
                    first = line.strip()
                    break
            else:
                raise BadInput(f"{name} is empty.")
            if first.startswith("["):  # a .json file holding one array of objects
                f.seek(0)
                row = json.load(f)[0]
            else:
                row = json.loads(first)
    except (json.JSONDecodeError, IndexError):
        raise BadInput(f"{name} does not start with a JSON object; each line of a JSONL file must be one.") from None
    except (UnicodeDecodeError, OSError, csv.Error):
        raise BadInput(f"{name} could not be read as UTF-8 JSONL or CSV.") from None
    if not isinstance(row, dict):
        raise BadInput(f"{name} does not start with a JSON object; each line of a JSONL file must be one.")
    return [str(k) for k in row]


def _number(value: object, label: str, integer: bool, low: float, high: float) -> float | int:
    if value is None or (isinstance(value, str) and not value.strip()):
        raise BadInput(f"{label} is empty: enter a number.")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise BadInput(f"{label} must be a number, not {value!r}.") from None
    if number != number:  # NaN
        raise BadInput(f"{label} must be a number.")
    if integer:
        if number != int(number):
            raise BadInput(f"{label} must be a whole number, not {number:g}.")
        number = int(number)
    if not low <= number <= high:
        raise BadInput(f"{label} must be between {_plain(low)} and {_plain(high)}, not {_plain(number)}.")
    return number


def _plain(x: float) -> str:
    """A number as people write it: 2,147,483,647 rather than 2.14748e+09; 0.95 as is."""
    x = float(x)
    if x.is_integer() and abs(x) < 1e18:
        return f"{int(x):,}"
    return f"{x:g}"


def parse_flag(value: object, label: str) -> bool:
    """A checkbox value: a bool, or its usual spellings from an API client."""
    if isinstance(value, bool):
        return value
    spelled = str(value).strip().lower()
    if spelled in ("true", "1", "yes", "on"):
        return True
    if spelled in ("false", "0", "no", "off"):
        return False
    raise BadInput(f"{label} must be true or false, not {value!r}.")


def decoding_kwargs(
    strategy: str = "beam",
    num_beams: object = 4,
    length_penalty: object = 1.0,
    no_repeat_ngram_size: object = 3,
    min_length: object = 10,
    max_length: object = 128,
    temperature: object = 1.0,
    top_k: object = 50,
    top_p: object = 0.95,
    seed: object = -1,
    repetition_penalty: object = 1.0,
    no_repeat_word: object = True,
    coverage_penalty: object = DecodingConfig.coverage_penalty,
    source_spelling: object = DecodingConfig.source_spelling,
) -> dict:
    """The UI's decoding settings as `summarize()` keyword arguments, checked (BadInput)."""
    strategy = (strategy or "").strip().lower()
    if strategy == "sample":
        strategy = "sampling"
    if strategy not in STRATEGIES:
        raise BadInput(f"Decoding must be one of {', '.join(STRATEGIES)}, not {strategy!r}.")
    kw = dict(
        min_length=_number(min_length, "Min length", True, 0, MAX_NEW_TOKENS),
        max_length=_number(max_length, "Max length", True, 1, MAX_NEW_TOKENS),
        no_repeat_ngram_size=_number(no_repeat_ngram_size, "No-repeat n-gram size", True, 0, 10),
        # Below 1 it would reward repeating; transformers allows it, a summary never wants it.
        repetition_penalty=_number(repetition_penalty, "Repetition penalty", False, 1, 5),
        no_repeat_word=parse_flag(no_repeat_word, "Block word stutter"),
        source_spelling=parse_flag(source_spelling, "Spell words as the source does"),
    )
    if kw["min_length"] > kw["max_length"]:
        raise BadInput(f"Min length ({kw['min_length']}) must not exceed max length ({kw['max_length']}).")
    if strategy == "beam":
        kw["num_beams"] = _number(num_beams, "Beams", True, 1, MAX_BEAMS)
        kw["length_penalty"] = _number(length_penalty, "Length penalty", False, -5, 5)
        kw["coverage_penalty"] = _number(coverage_penalty, "Coverage penalty", False, 0, 20)
    elif strategy == "sampling":
        seed = _number(-1 if seed is None or seed == "" else seed, "Seed", True, -1, 2**31 - 1)
        kw.update(
            do_sample=True,
            temperature=_number(temperature, "Temperature", False, 0, 10),
            top_k=_number(top_k, "Top-k", True, 0, 100_000),
            top_p=_number(top_p, "Top-p", False, 0, 1),
            seed=None if seed < 0 else seed,
        )
        if kw["top_p"] <= 0:
            raise BadInput("Top-p must be above 0 (1 keeps every token).")
    DecodingConfig(**kw)  # the library's own checks (DecodingError is a ValueError too)
    return kw
