"""Spelling from the source (`DecodingConfig.source_spelling`): a word decoding writes over
several WordPieces must spell a word of the source.

A small summarizer that copies WordPieces can garble a name it copies ("albert maysled" for
"albert maysles"), stutter a piece ("leprechaun" + "##un" + "##un"), glue a piece to the wrong
word ("the" + "##wings"), stop half-way ("yanukov" for "yanukovych") or hang "n't" on a word
that cannot take it ("also" + "n ' t" reads "alson't"). Of the first 1,000 CNN test summaries
(beam 4), 94 had a word that is neither in the article nor a whole vocabulary word; with the rule,
37, mostly real words the vocabulary splits ("pleads"). The rule, per row and step:

- a piece that continues a word (`##...`) is allowed only where the word so far, with it, is
  still the start of a source word; or where it is an ending (`##s`, `##ed`, `##ing`, ...)
  after a content word (not a function word or punctuation) that is a whole source word or one
  piece ("plead" + "##s" where the source says "pleaded");
- a word that is the start of a source word but no word itself (several pieces, not a source
  word) must go on: only the pieces that continue it as a source word are allowed;
- "n" (of PTB's "n ' t") may follow only words that take "n't" ("did", "is", "ca", ...), or a
  word the source puts it after ("rock 'n' roll", "charlotte, n.c.").

Words the model knows but the source does not use, when written over several pieces, are lost
with it ("zelizer", a CNN columnist named only in a byline): the price of the rule, measured
in docs/training_history.md."""
from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import numpy as np

if TYPE_CHECKING:  # decoding.py imports this module
    from .decoding import WordPieces

# Pieces a word may end with where the source has its stem ("accuse" + "##s", "1990" + "##s"); not
# "##th" or "##nd", which glue to words as readily as to numbers ("were" + "##nd").
ENDINGS = tuple("##s ##es ##ed ##d ##ing ##er ##ers ##ly".split())
# Words PTB's tokenization splits "n't" off (`did n't`, `ca n't`, `wo n't`); only these take it.
NEGATABLE = tuple(
    "is are was were do does did has have had could would should ca wo need must might ai sha dare".split()
)
NEGATION = "n"  # "didn't" is `did n ' t` in WordPieces of PTB text


def row_spellings(src_ids: np.ndarray, words: "WordPieces", beams: int = 1) -> list["SourceSpelling"]:
    """One `SourceSpelling` per decoding row of a (B, S) batch of sources: rows b*beams + k
    share input b's."""
    per_input = [SourceSpelling(ids, words) for ids in np.asarray(src_ids).tolist()]
    return [s for s in per_input for _ in range(beams)]


class SourceSpelling:
    """The words of one source, as tuples of piece ids, and what they allow a decoder to write."""

    def __init__(self, src_ids: Sequence[int], words: "WordPieces") -> None:
        """`src_ids`: one source's ids (special tokens and padding do no harm); `words`: the
        tokenizer's `WordPieces`."""
        self.words = words
        self.source: set[tuple[int, ...]] = set()  # the source's words
        self.next: dict[tuple[int, ...], set[int]] = {}  # start of a source word -> pieces that go on with it
        self.before_n: set[tuple[int, ...]] = set()  # words the source puts "n" after ("rock 'n' roll")
        self._answers: dict[tuple[int, ...], tuple[list[int], bool]] = {}  # `allowed`, per word: asked every row and step
        source_words = words.split_words(list(map(int, src_ids)))
        for i, word in enumerate(source_words):
            self.source.add(word)
            for j in range(1, len(word)):
                self.next.setdefault(word[:j], set()).add(word[j])
            if i and word == (words.negation,):
                self.before_n.add(source_words[i - 1])

    def allowed(self, word: tuple[int, ...]) -> tuple[list[int], bool]:
        """The word-continuing pieces that may follow `word`, and whether the word must go on
        (it starts a source word without being a word)."""
        if word not in self._answers:
            self._answers[word] = self._allowed(word)
        return self._answers[word]

    def _allowed(self, word: tuple[int, ...]) -> tuple[list[int], bool]:
        nexts = self.next.get(word, set())
        if len(word) > 1 and word not in self.source and nexts:
            return sorted(nexts), True
        w = self.words
        content = not (len(word) == 1 and word[0] in w.fillers)
        takes_ending = content and (word in self.source or len(word) == 1) and word[-1] not in w.endings
        return sorted(nexts | w.endings) if takes_ending else sorted(nexts), False

    def restrict(self, row: np.ndarray, history: list[int]) -> None:
        """Ban (-inf, in place) in one row of logits what would misspell the word `history` ends
        with (or start the summary with a continuing piece). A ban that would leave the row
        nothing to write is not made: a name's next piece can be banned already, by the
        trigram rule when the name comes again ("ro ##uh" + "##h" for a second "rouhani").
        Exempting such pieces from the n-gram ban let names repeat where the summaries had said
        "he" and cost 0.2 ROUGE on 214 CNN validation stories, so a few garbles remain."""
        w = self.words
        word = w.last_word(history)  # () at the start: no piece may continue nothing
        keep, must_go_on = self.allowed(word)
        kept = row[keep]
        if must_go_on:
            if not np.isfinite(kept).any():
                return
            row[:] = -np.inf
        elif np.isfinite(kept).any() or np.isfinite(row[w.word_starts]).any():
            row[w.continuations] = -np.inf
        row[keep] = kept
        if w.negation is not None and word not in w.negatable and word not in self.before_n:
            row[w.negation] = -np.inf
