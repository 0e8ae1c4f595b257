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
    spelling = SourceSpelling(_ids(tokenizer, "the man pleaded guilty , and he was in court"), words)
    s, ed = tokenizer.token_id("##s"), tokenizer.token_id("##ed")
    plead = _ids(tokenizer, "plead")
    assert len(plead) == 1
    assert s in spelling.allowed(tuple(plead))[0]  # "pleads"
    for function_word in ("the", "was", "in", ","):  # source words, but no "the" + "##s", "was" + "##d"
        assert spelling.allowed((tokenizer.token_id(function_word),)) == ([], False), function_word
    assert spelling.allowed((plead[0], s)) == ([], False)  # no "plead" + "##s" + "##ed"
    assert ed in spelling.allowed(tuple(plead))[0]


def test_restrict_bans_misspellings_in_a_row_of_logits(tokenizer, words):
    V = tokenizer.vocab_size
    name = _pieces(tokenizer, "maysles")
    spelling = SourceSpelling(_ids(tokenizer, "albert maysles died"), words)
    wrong = tokenizer.token_id("##led")
    assert wrong is not None and wrong != name[1]
    row = np.zeros(V, np.float32)
    spelling.restrict(row, _ids(tokenizer, "director") + name[:1])  # its first piece: may end, or go on as the source's...
    assert row[wrong] == -np.inf and row[name[1]] == 0 and row[tokenizer.token_id("died")] == 0
    row = np.zeros(V, np.float32)
    spelling.restrict(row, name[:2])  # several pieces, no word yet: only the source's next piece
    assert np.isfinite(row).sum() == 1 and row[name[2]] == 0
    row = np.zeros(V, np.float32)
    spelling.restrict(row, [])  # a summary does not start with a continuing piece
    assert row[wrong] == -np.inf and row[tokenizer.token_id("albert")] == 0
    # "also" + "n ' t" reads "alson't"; "did" + "n ' t" is "didn't"; "rock 'n' roll" where the source has it.
    n = tokenizer.token_id("n")
    rock = SourceSpelling(_ids(tokenizer, "a rock ' n ' roll band"), words)
    for before, banned in (("also", True), ("did", False), ("ca", False), ("rock '", False)):
        row = np.zeros(V, np.float32)
        rock.restrict(row, _ids(tokenizer, f"he {before}"))
        assert (row[n] == -np.inf) == banned, before
    row = np.zeros(V, np.float32)
    spelling.restrict(row, _ids(tokenizer, "a rock '"))  # not where this source has no "' n"
    assert row[n] == -np.inf


def test_restrict_leaves_a_row_it_would_empty(tokenizer, words):
    name = _pieces(tokenizer, "maysles")
    spelling = SourceSpelling(_ids(tokenizer, "albert maysles died"), words)
    row = np.zeros(tokenizer.vocab_size, np.float32)
    row[name[2]] = -np.inf  # the only piece that would finish the word is banned already
    spelling.restrict(row, name[:2])
    assert np.isfinite(row).sum() == tokenizer.vocab_size - 1  # the row is left as it was
    # Not forced: where every word start and every allowed piece is banned already, the other
    # continuing pieces stay.
    row = np.zeros(tokenizer.vocab_size, np.float32)
    row[words.word_starts] = -np.inf
    keep, must_go_on = spelling.allowed(tuple(name[:1]))
    assert not must_go_on
    row[keep] = -np.inf
    spelling.restrict(row, name[:1])
    assert np.isfinite(row).sum() == len(words.continuations) - len(keep)


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
    sampled = DecodingConfig(max_length=8, do_sample=True, temperature=0.5, seed=3)
    assert wrong not in generate(tiny_model, src, None, sampled, words)[0].tokens


def test_each_input_of_a_batch_spells_from_its_own_source(tiny_model, tokenizer, words):
    """Rows b*K + k of beam search are input b's: each keeps to its own article."""
    first = _pieces(tokenizer, "yanukovych")
    texts = ["viktor yanukovych fled kiev", "the court met in kiev"]
    batch = tokenizer.batch_encode(texts, max_length=32)
    src, mask = mx.array(batch.ids), mx.array(batch.attention_mask)
    bias = np.zeros(tiny_model.config.vocab_size, dtype=np.float32)
    for piece, value in zip(first, (60.0, 59.0, 58.0, 57.0)):  # "yan ##uk ##ov ##ych", then the end
        bias[piece] = value
    bias[tiny_model.config.sep_id] = 50.0
    tiny_model.decoder.lm_head.bias = mx.array(bias)
    for beams in (1, 3):
        cfg = DecodingConfig(max_length=8, num_beams=beams)
        hyps = generate(tiny_model, src, mask, cfg, words)
        assert first[1] in hyps[0].tokens  # the first article has "yanukovych": "yan ##uk" may go on...
        assert first[1] not in hyps[1].tokens, hyps[1].tokens  # ...the second has no such word
        for h, ids in zip(hyps, batch.ids):
            known = set(words.split_words(ids))
            assert all(len(w) == 1 or w in known for w in words.split_words(h.tokens)), h.tokens
