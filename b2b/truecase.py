"""Give an uncased model's summary back the capitalisation of its source.

An uncased BERT writes `zully broussard gave a kidney to a stranger in san francisco`; the
article says `Zully Broussard` and `San Francisco`. Summaries copy most of their words from
the article, so each word takes the casing it most often has there (sentence-initial uses are
not counted: they are capitalised whatever the word)."""
from __future__ import annotations

import re
from collections import Counter, defaultdict

from .text import TITLES


_WORD = re.compile(r"[^\W\d_](?:[\w'’.-]*\w)?")
_POSSESSIVE = re.compile(r"['’]s$", re.IGNORECASE)
_SENTENCE_START = re.compile(r"(?:^|[.!?:][\"'’”)\]]*\s+|\n\s*|[\"“(]\s*)$")
# After a title's or a single initial's full stop comes a name; a sentence can end in "U.S." or
# "a.m.", so other abbreviations do not count.
_TITLE_STOP = re.compile(r"(?:^|[\s(])([A-Za-z]+)\.\s+$")


def casing_table(source: str) -> dict[str, str]:
    """lowercased word -> its most frequent form in `source`, away from sentence starts."""
    counts: dict[str, Counter] = defaultdict(Counter)
    for m in _WORD.finditer(source):
        start = m.start()
        if start == 0 or _SENTENCE_START.search(source[max(0, start - 4) : start]) and not _after_title(source, start):
            continue
        counts[m.group().lower()][m.group()] += 1
        stem = _POSSESSIVE.sub("", m.group())
        if stem != m.group():  # "Italy's": a summary may say "italy" alone
            counts[stem.lower()][stem] += 1
        if "-" in m.group():  # "Radnor-Wayne": a summary may copy "radnor" alone
            for part in m.group().split("-"):
                if part[:1].isalpha():
                    counts[part.lower()][part] += 1
    return {low: forms.most_common(1)[0][0] for low, forms in counts.items()}


def _after_title(source: str, start: int) -> bool:
    """The word at `start` follows a title's or an initial's full stop ("Sgt. Bowe", "Dr. Ruth",
    "John F. Kennedy"), not a sentence's: names sit there, and would otherwise go uncounted."""
    m = _TITLE_STOP.search(source, max(0, start - 12), start)  # a short window: no copy of the text
    return bool(m) and (len(m.group(1)) == 1 or m.group(1).lower() in TITLES)


def truecase(summary: str, source: str) -> str:
    """`summary` with words re-cased as `source` writes them (unknown words unchanged)."""
    return apply_casing(summary, casing_table(source))


def apply_casing(summary: str, table: dict[str, str]) -> str:
    """`summary` re-cased with a `casing_table`: build the table once per source, apply it often."""

    def fix(m: re.Match) -> str:
        word = m.group()
        form = table.get(word.lower())
        stem = _POSSESSIVE.sub("", word)
        if form is None and stem != word and stem.lower() in table:  # "france's": the source has "France"
            form = table[stem.lower()] + word[len(stem):]
        if form is None or form == form.lower():
            return word  # not in the source, or a common word: keep the sentence-start capital
        return form

    return _WORD.sub(fix, summary)
