"""Text clean-up for PTB / WordPiece token streams: readable sentences and sentence splits.

`detokenize` turns `the man 's dog did n't go .` into `The man's dog didn't go.`; it is what
`Tokenizer.decode` returns and what ROUGE and the app show. `split_sentences` gives the
newline-separated sentences rouge-score's ROUGE-Lsum expects. `glued_words` tells, word by word,
where `detokenize` writes no space, for text that must stay split into words (a highlighted source).
"""
from __future__ import annotations

import re


class TokenizerError(ValueError):
    """Bad input to the tokenizer, or a tokenizer that cannot be found or loaded."""


def check_str(text: object, what: str = "text") -> str:
    """`text` itself when it is a str; a TokenizerError naming `what` otherwise."""
    if not isinstance(text, str):
        raise TokenizerError(f"{what} must be a str, got {type(text).__name__}.")
    return text


# Titles a name follows ("Sgt. Bowe", "Dr. Sanjay"): their period never ends a sentence.
TITLES = frozenset("mr mrs ms dr prof gen sen rep gov lt col sgt capt cpl maj adm rev".split())
# Words whose trailing period does not end a sentence.
_ABBREVIATIONS = TITLES | frozenset(
    "st jr sr vs mt ft jan feb mar apr aug sep sept oct nov dec inc ltd co corp dept est approx".split()
)
_KEEP_LOWER = frozenset({"i.e.", "e.g.", "a.m.", "p.m."})
_UPPER_WORDS = {w: w.upper() for w in ("cnn", "fbi", "cia", "nasa", "bbc", "nfl", "nba")}
_UPPER_RE = re.compile(r"(?<![@.])\b(" + "|".join(_UPPER_WORDS) + r")\b(?!\.\w)", re.I)
_GLUE_LEFT = frozenset(". , ; : ! ? % ) ] } ... n't n’t 's 're 've 'll 'd 'm ” ’".split())
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


def _glued_tokens(tokens: list[str]) -> list[bool]:
    """For each cleaned token, whether it is written with no space before it: punctuation
    attaches, quotes pair (open: glue right, close: left)."""
    glued, glue_next, is_open = [], True, {'"': False, "'": False}
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
        glued.append(glue_next or left)
        glue_next = right
    return glued


def _glue(tokens: list[str]) -> str:
    """Join cleaned tokens, a space before each one that is not glued."""
    return "".join(t if g else " " + t for t, g in zip(tokens, _glued_tokens(tokens)))


def _clean(line: str) -> list[str]:
    """One line's tokens after the `_REPLACEMENTS`: `did n't`, `u.s.`, `1,000` become one token each."""
    line = " " + " ".join(line.split()) + " "
    for pattern, repl in _REPLACEMENTS:
        line = pattern.sub(repl, line)
    return line.split()


def glued_words(words: list[str]) -> list[bool]:
    """For each word of one line (WordPieces merged, punctuation split off: `don ' t`, `" hi "`),
    whether `detokenize` writes it with no space before it; the first word counts as glued.
    A word the clean-up drops (the second `.` of `a.m. .`, half of a `` ` ` `` quote) is glued."""
    words = ["".join(w.split()) for w in words]
    tokens = _clean(" ".join(words))
    # The clean-up keeps every character except a few rewrites, so the words are found in the
    # tokens run together; a word starting where a spaced token starts has a space before it.
    text, spaced = "", set()
    for tok, glued in zip(tokens, _glued_tokens(tokens)):
        if not glued:
            spaced.add(len(text))
        text += tok
    out, at, swallowed = [], 0, False
    for word in words:
        if swallowed:  # the second half of a two-word quote rewritten as one "
            out.append(True)
            swallowed = False
            continue
        if text.startswith(word, at):
            size = len(word)
        elif text.startswith('"', at) and word in ("``", "''", "`", "'"):  # PTB quotes become "
            size, swallowed = 1, len(word) == 1
        elif re.fullmatch(r"@[-,.]@", word) and text.startswith(word[1], at):  # WikiText's 1 @,@ 000
            size = 1
        else:  # dropped
            out.append(True)
            continue
        out.append(at not in spaced)
        at += size
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
    for line in check_str(text).split("\n"):
        lines.append(_capitalize(_glue(_clean(line))))
    return "\n".join(lines)


_SPLIT = re.compile(r"(?<=[.!?])[\"'’”)\]]*(?=\s)|\n")
_LOWER_NEXT = re.compile(r"\s+[a-z]")
_PTB_CLOSE_QUOTE = re.compile(r"[ \t]+(?:\"|'')(?=\s|$)")


def split_sentences(text: str) -> list[str]:
    """Split at . ! ? (+ closing quotes) before whitespace, and at newlines; not after
    abbreviations or initials. Works on raw and on PTB-tokenized (spaced) text."""
    sentences, start = [], 0
    cased = check_str(text) != text.lower()  # then a lowercase next word goes on: `"Hi!" she said`
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
