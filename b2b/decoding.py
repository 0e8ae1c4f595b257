"""Decoding settings: one frozen dataclass, checked when it is made, so a bad setting is a
sentence naming it before any token is decoded."""
from __future__ import annotations

import math
import string
from dataclasses import dataclass, fields
from functools import cached_property

import numpy as np

from .spelling import ENDINGS, NEGATABLE, NEGATION
from .typecheck import type_problem


class DecodingError(ValueError):
    """Invalid decoding settings."""


@dataclass(frozen=True)
class DecodingConfig:
    """How to decode: greedy (the default), sampling, or beam search. Build it from user
    settings with `from_kwargs`, which also rejects unknown names."""

    max_length: int = 128  # new tokens; CNN/DM highlights are ~60 WordPieces
    min_length: int = 0  # [SEP] is banned before this many tokens
    num_beams: int = 1
    length_penalty: float = 1.0  # beam scores are divided by length ** length_penalty
    no_repeat_ngram_size: int = 3  # summaries that repeat a trigram read badly; 0 turns it off
    # A word or phrase may not follow itself, directly or across one of JOINERS ("texas, texas",
    # "new york and new york", "the video of the video", "city beach city beach"), and a pair of
    # content words may not come twice in one sentence ("police say ... police say"): small
    # summarizers stutter so ("more and more" is lost with them). Needs the tokenizer's word
    # pieces (summarize() has them).
    no_repeat_word: bool = True
    repetition_penalty: float = 1.0  # transformers' (CTRL's): > 1 makes tokens already written less likely; 1: off
    # Beam search with a pointer model: a beam's score loses this times the copy attention it has
    # spent past 1 on any source position (Gehrmann et al. 2018's "summary" coverage penalty,
    # OpenNMT's -coverage_penalty summary -stepwise_penalty): it steers beams off what they have
    # already said ("he was 88-year-old ..., was 88"). 1 was chosen on validation articles (ROUGE-1
    # and -Lsum +0.2-0.5, ROUGE-2 level; README). 0: off; greedy, sampling and models without a
    # pointer ignore it.
    coverage_penalty: float = 1.0
    # A word written over several WordPieces must spell a source word (or its stem plus -s, -ed,
    # -ing...), and one started must be finished: no "albert maysled" for "albert maysles", no
    # "leprechaununun", no "alson't" (b2b/spelling.py; 9 % of CNN test summaries had a made-up word, 4 % with it).
    # Needs the tokenizer's word pieces and the source (summarize() has both).
    source_spelling: bool = True
    early_stopping: bool = True  # beam: stop once num_beams hypotheses have finished
    do_sample: bool = False
    temperature: float = 1.0
    top_k: int = 0  # 0: no top-k filter
    top_p: float = 1.0  # nucleus sampling; 1.0: no filter
    seed: int | None = None

    def __post_init__(self) -> None:
        if problem := type_problem(self):
            raise DecodingError(problem)
        checks = [
            (self.max_length >= 1, f"max_length must be at least 1, got {self.max_length}."),
            (self.min_length >= 0, f"min_length must not be negative, got {self.min_length}."),
            (self.max_length >= self.min_length, f"max_length ({self.max_length}) must be at least min_length ({self.min_length})."),
            (self.num_beams >= 1, f"num_beams must be at least 1, got {self.num_beams}."),
            (self.no_repeat_ngram_size >= 0, f"no_repeat_ngram_size must not be negative, got {self.no_repeat_ngram_size}."),
            (math.isfinite(self.length_penalty), f"length_penalty must be a finite number, got {self.length_penalty}."),
            (0 < self.repetition_penalty < math.inf, f"repetition_penalty must be a positive number, got {self.repetition_penalty}."),
            (0 <= self.coverage_penalty < math.inf, f"coverage_penalty must be 0 or a positive number, got {self.coverage_penalty}."),
            (self.temperature >= 0, f"temperature must be 0 or more, got {self.temperature}."),
            (0 < self.top_p <= 1, f"top_p must be in (0, 1], got {self.top_p}."),
            (self.top_k >= 0, f"top_k must not be negative, got {self.top_k}."),
            (not (self.do_sample and self.num_beams > 1), "Sampling with num_beams > 1 is not supported: choose one."),
        ]
        for ok, message in checks:
            if not ok:
                raise DecodingError(message)

    @classmethod
    def from_kwargs(cls, **settings) -> "DecodingConfig":
        """Like the constructor, but an unknown setting is a DecodingError that lists the valid ones."""
        valid = [f.name for f in fields(cls)]
        unknown = sorted(set(settings) - set(valid))
        if unknown:
            names = ", ".join(map(repr, unknown))
            raise DecodingError(f"Unknown decoding setting {names}; valid settings are {', '.join(valid)}.")
        return cls(**settings)

    @property
    def strategy(self) -> str:
        if self.num_beams > 1:
            return "beam"
        return "sample" if self.do_sample and self.temperature > 0 else "greedy"


# Words a phrase may not follow itself across (`no_repeat_word`): the ones small summarizers
# stutter over. Not "to", "by", "for" or "after", which real phrases repeat across ("face to
# face", "side by side", "word for word", "day after day").
JOINERS = (",", "and", "or", "of")

# Words a repeated pair may hold (`no_repeat_word` bans a pair of other words coming twice in
# one sentence: "police say ... police say", "ted cruz ... ted cruz"): "the president ... the
# president" and "in the ... in the" are how sentences are built. Punctuation counts with them.
FUNCTION_WORDS = tuple(
    "a an the this that these those some any each every no not all both either neither "
    "of to in on at by for with from into onto over under about after before since until "
    "through during against between among within without near off out up down as than "
    "and or but nor so yet if because while when where which who whom whose what how why "
    "i me my we us our you your he him his she her it its they them their there here "
    "is are was were be been being am has have had having do does did will would shall "
    "should can could may might must s t d ll re ve m also just only very more most".split()
)
SENTENCE_ENDS = (".", "!", "?")


@dataclass(frozen=True)
class WordPieces:
    """What decoding must know of the vocabulary to apply `no_repeat_word` and `source_spelling`
    (token ids alone do not say where words start). Built from a Tokenizer with `of` (as
    `summarize` does)."""

    continues: np.ndarray  # (V,) bool: the piece continues the word before it (WordPiece "##ing")
    joiners: frozenset[int]  # a phrase may not follow itself across one of these either (JOINERS' ids)
    span: int = 4  # the longest phrase checked, in words
    fillers: frozenset[int] = frozenset()  # FUNCTION_WORDS' and punctuation's ids: a repeated pair may hold them
    sentence_ends: frozenset[int] = frozenset()  # SENTENCE_ENDS' ids: pairs repeat freely across them
    # For `source_spelling` (b2b/spelling.py): the ids of its ENDINGS, of NEGATION and of the
    # NEGATABLE words (as one-piece words).
    endings: frozenset[int] = frozenset()
    negation: int | None = None
    negatable: frozenset[tuple[int, ...]] = frozenset()

    @classmethod
    def of(cls, tokenizer) -> "WordPieces":
        """From a b2b Tokenizer: its word-continuing pieces and the ids it has of JOINERS,
        FUNCTION_WORDS, punctuation, SENTENCE_ENDS and of what `source_spelling` needs."""
        def ids(words) -> frozenset[int]:
            return frozenset(i for i in map(tokenizer.token_id, words) if i is not None)

        fillers = ids(FUNCTION_WORDS) | ids(string.punctuation)
        return cls(
            tokenizer.continues_word, ids(JOINERS), fillers=fillers, sentence_ends=ids(SENTENCE_ENDS),
            endings=ids(ENDINGS), negation=tokenizer.token_id(NEGATION), negatable=frozenset((i,) for i in ids(NEGATABLE)),
        )

    @cached_property
    def continuations(self) -> np.ndarray:
        """Ids of the pieces that continue a word."""
        return np.flatnonzero(self.continues)

    @cached_property
    def word_starts(self) -> np.ndarray:
        """Ids of the pieces that start a word."""
        return np.flatnonzero(~np.asarray(self.continues, dtype=bool))

    def split_words(self, ids: list[int]) -> list[tuple[int, ...]]:
        """`ids` as words, each a tuple of its pieces."""
        return self._last_words(ids, len(ids))

    def last_word(self, history: list[int]) -> tuple[int, ...]:
        """The word `history` ends with (its pieces so far); () for an empty history."""
        words = self._last_words(history, 1)
        return words[0] if words else ()

    def banned(self, history: list[int]) -> list[int]:
        """What `no_repeat_word` bans after `history`: `stutters` and `repeats`."""
        return self.stutters(history) + self.repeats(history)

    def repeats(self, history: list[int]) -> list[int]:
        """First pieces of the words that would make a pair of content words (neither one of
        `fillers`) come twice in the sentence being written ("police say ... police say")."""
        words = self._last_words(history, len(history))
        ends = [i for i, word in enumerate(words) if len(word) == 1 and word[0] in self.sentence_ends]
        words = words[ends[-1] + 1 :] if ends else words
        if not words or self._filler(words[-1]):
            return []
        last = words[-1]  # pairs it began before: their second word would repeat them
        return [words[i + 1][0] for i in range(len(words) - 2) if words[i] == last and not self._filler(words[i + 1])]

    def _filler(self, word: tuple[int, ...]) -> bool:
        """A one-piece function word or punctuation mark."""
        return len(word) == 1 and word[0] in self.fillers

    def stutters(self, history: list[int]) -> list[int]:
        """First pieces of the words that would complete a phrase following itself: directly
        ("texas texas", "city beach city beach") or across the last joiner ("texas, texas",
        "march 7, march 7", "new york and new york", "the sale of the sale"). Phrases of up to
        `span` words."""
        words = self._last_words(history, 2 * self.span)
        n = len(words)
        banned = []
        for k in range(1, min(self.span, (n + 1) // 2) + 1):
            # A phrase of k words, then its first k - 1 again: its k-th word would end the copy.
            if words[n - k + 1 :] == words[n - 2 * k + 1 : n - k]:
                banned.append(words[n - k][0])
        for j in range(n - 1, max(n - self.span, 1) - 1, -1):
            if len(words[j]) == 1 and words[j][0] in self.joiners:
                # The m words since the joiner repeat the m before words[j - 1]: it would end the copy.
                m = n - 1 - j
                if j - m - 1 >= 0 and words[j - m - 1 : j - 1] == words[j + 1 :]:
                    banned.append(words[j - 1][0])
                break
        return banned

    def _last_words(self, history: list[int], count: int) -> list[tuple[int, ...]]:
        """The last `count` words of `history` (fewer if it is shorter), each a tuple of its
        pieces, oldest first. A word starts at a piece that does not continue the one before."""
        words = []
        end = len(history)
        while end > 0 and len(words) < count:
            start = end - 1
            while start > 0 and history[start] < len(self.continues) and self.continues[history[start]]:
                start -= 1
            words.append(tuple(history[start:end]))
            end = start
        return words[::-1]
