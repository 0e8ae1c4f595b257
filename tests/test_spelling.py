"""Spelling from the source (b2b/spelling.py): the rule on its own, on a row of logits, and in
decoding."""
import mlx.core as mx
import numpy as np
import pytest

from b2b import DecodingConfig, generate
from b2b.decoding import WordPieces
from b2b.spelling import SourceSpelling


@pytest.fixture(scope="module")
def words(tokenizer):
    return WordPieces.of(tokenizer)  # as summarize() builds it


def _ids(tokenizer, text):
    return tokenizer.encode(text, add_special_tokens=False).ids


def _pieces(tokenizer, word):
    pieces = _ids(tokenizer, word)
    assert len(pieces) > 2, f"the test needs {word!r} to take several pieces"
    return pieces


def test_a_started_source_word_goes_on_as_the_source_spells_it(tokenizer, words):
    name = _pieces(tokenizer, "yanukovych")
    spelling = SourceSpelling(_ids(tokenizer, "viktor yanukovych fled kiev"), words)
    for i in range(2, len(name)):  # several pieces, not yet a word: only the next one may follow
        assert spelling.allowed(tuple(name[:i])) == ([name[i]], True)
    keep, must = spelling.allowed(tuple(name[:1]))  # one piece is a word: it may end, or go on
    assert name[1] in keep and not must
    keep, must = spelling.allowed(tuple(name))  # the whole source word: endings ("...s") only
    assert not must and tokenizer.token_id("##s") in keep and name[1] not in keep


def test_endings_follow_content_words_not_function_words_or_other_endings(tokenizer, words):
    spelling = SourceSpelling(_ids(tokenizer, "he pleaded guilty"), words)
    s, ed = tokenizer.token_id("##s"), tokenizer.token_id("##ed")
    plead = _ids(tokenizer, "plead")
    assert len(plead) == 1
    assert s in spelling.allowed(tuple(plead))[0]  # "pleads"
    assert spelling.allowed((tokenizer.token_id("the"),)) == ([], False)  # no "the" + "##wings"
    assert spelling.allowed((plead[0], s)) == ([], False)  # no "plead" + "##s" + "##ed"
    assert ed in spelling.allowed(tuple(plead))[0]


def test_restrict_bans_misspellings_in_a_row_of_logits(tokenizer, words):
    V = tokenizer.vocab_size
    name = _pieces(tokenizer, "maysles")
    spelling = SourceSpelling(_ids(tokenizer, "albert maysles died"), words)
    wrong = tokenizer.token_id("##led")
    assert wrong is not None and wrong != name[1]
    row = np.zeros(V, np.float32)
    spelling.restrict(row, _ids(tokenizer, "director") + name[:1])  # "mays": may end or go on as "##les"...
    assert row[wrong] == -np.inf and row[name[1]] == 0 and row[tokenizer.token_id("died")] == 0
    row = np.zeros(V, np.float32)
    spelling.restrict(row, name[:2])  # several pieces, no word yet: only the source's next piece
    assert np.isfinite(row).sum() == 1 and row[name[2]] == 0
    row = np.zeros(V, np.float32)
    spelling.restrict(row, [])  # a summary does not start with a continuing piece
    assert row[wrong] == -np.inf and row[tokenizer.token_id("albert")] == 0
    # "also" + "n ' t" reads "alson't"; "did" + "n ' t" is "didn't".
    n = tokenizer.token_id("n")
    for before, banned in (("also", True), ("did", False), ("ca", False)):
        row = np.zeros(V, np.float32)
        spelling.restrict(row, _ids(tokenizer, f"he {before}"))
        assert (row[n] == -np.inf) == banned, before


def test_restrict_leaves_a_row_it_would_empty(tokenizer, words):
    name = _pieces(tokenizer, "maysles")
    spelling = SourceSpelling(_ids(tokenizer, "albert maysles died"), words)
    row = np.zeros(tokenizer.vocab_size, np.float32)
    row[name[2]] = -np.inf  # the only piece that would finish the word is banned already
    spelling.restrict(row, name[:2])
    assert np.isfinite(row[words.continuations]).sum() == len(words.continuations) - 1
    assert np.isfinite(row[words.word_starts]).sum() == len(words.word_starts) - 1  # only "n" (of "n't")


def test_decoding_spells_words_as_the_source_does(tiny_model, tokenizer, words):
    text = "albert maysles died"
    src = mx.array([tokenizer.encode(text).ids])
    name, wrong = _pieces(tokenizer, "maysles"), tokenizer.token_id("##led")
    bias = np.zeros(tiny_model.config.vocab_size, dtype=np.float32)
    bias[wrong], bias[name[0]], bias[tiny_model.config.sep_id] = 60.0, 55.0, 50.0  # "##led" first, else "mays"
    tiny_model.decoder.lm_head.bias = mx.array(bias)
    for beams in (1, 3):
        loose = DecodingConfig(max_length=8, num_beams=beams, source_spelling=False)
        assert wrong in generate(tiny_model, src, None, loose, words)[0].tokens
        strict = DecodingConfig(max_length=8, num_beams=beams)
        tokens = generate(tiny_model, src, None, strict, words)[0].tokens
        assert tokens and wrong not in tokens, tokens
        source_words = set(words.split_words(list(src[0].tolist())))
        for word in words.split_words(tokens):
            assert len(word) == 1 or word in source_words, word
        # Without word pieces (a bare generate call), the rule cannot apply.
        assert wrong in generate(tiny_model, src, None, strict)[0].tokens
