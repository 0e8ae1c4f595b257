"""Decoding strategies on a tiny random model: constraints hold, batching and beams agree."""
import mlx.core as mx
import numpy as np
import pytest

from b2b import Bert2Bert, DecodingConfig, DecodingError, generate
from b2b.generate import beam_search, decode_stream, greedy_or_sample


def _src():
    src = mx.array([[101, 2000, 2001, 2002, 2003, 102, 0, 0], [101, 2004, 2005, 2006, 2007, 2008, 2009, 102]])
    return src, (src > 0).astype(mx.int32)


def _last(it):
    out = None
    for out in it:
        pass
    return out


def _ngrams(seq, n):
    return [tuple(seq[i : i + n]) for i in range(len(seq) - n + 1)]


def test_greedy_matches_argmax_of_full_pass(tiny_model):
    src, mask = _src()
    cfg = DecodingConfig(max_length=6, no_repeat_ngram_size=0)
    hyps = generate(tiny_model, src, mask, cfg)
    for b, h in enumerate(hyps):
        tgt = mx.array([[101] + h.tokens[:-1]])
        logits = tiny_model(src[b : b + 1], mask[b : b + 1], tgt)
        assert np.array(mx.argmax(logits, -1))[0].tolist() == h.tokens


def test_beam_search_with_one_beam_equals_greedy(tiny_model):
    src, mask = _src()
    cfg = DecodingConfig(max_length=8, no_repeat_ngram_size=0)
    memory = tiny_model.encode(src, mask)
    greedy = _last(greedy_or_sample(tiny_model, memory, mask, cfg))
    beam = _last(beam_search(tiny_model, memory, mask, cfg))
    assert [h.tokens for h in greedy] == [h.tokens for h in beam]


def test_batched_generation_matches_one_by_one(tiny_model):
    src, mask = _src()
    for cfg in (DecodingConfig(max_length=6), DecodingConfig(max_length=6, num_beams=3)):
        together = generate(tiny_model, src, mask, cfg)
        for b in range(2):
            n = int(mask[b].sum())
            alone = generate(tiny_model, src[b : b + 1, :n], mask[b : b + 1, :n], cfg)
            assert alone[0].tokens == together[b].tokens


def test_no_repeat_ngram_size_holds(tiny_model):
    src, mask = _src()
    # Make two tokens dominate so unconstrained decoding loops on them.
    bias = np.zeros(tiny_model.config.vocab_size, dtype=np.float32)
    bias[[2000, 2001]] = 50.0
    tiny_model.decoder.lm_head.bias = mx.array(bias)
    free = generate(tiny_model, src, mask, DecodingConfig(max_length=40, no_repeat_ngram_size=0))
    # A random tiny model loops; the constraint must break every loop.
    assert any(len(set(_ngrams(h.tokens, 2))) < len(_ngrams(h.tokens, 2)) for h in free)
    for beams in (1, 3):
        for h in generate(tiny_model, src, mask, DecodingConfig(max_length=40, num_beams=beams, no_repeat_ngram_size=2)):
            grams = _ngrams(h.tokens, 2)
            assert len(grams) == len(set(grams))


def test_repetition_penalty_is_transformers_rule():
    from b2b.generate import _penalize_repeats

    rng = np.random.default_rng(0)
    scores = rng.normal(size=(2, 50)).astype(np.float32) * 3
    histories = [[5, 7, 5], []]
    out = _penalize_repeats(scores.copy(), histories, 1.3, start_id=1)
    want = scores.copy()
    for r, seen in enumerate([{1, 5, 7}, {1}]):
        for t in seen:
            want[r, t] = scores[r, t] * 1.3 if scores[r, t] < 0 else scores[r, t] / 1.3
    np.testing.assert_allclose(out, want, rtol=1e-6)
    torch = pytest.importorskip("torch", reason="torch is optional (pip install torch==2.13.0); CI installs it")
    from transformers import RepetitionPenaltyLogitsProcessor

    ids = torch.tensor([[1, 5, 7, 5], [1, 1, 1, 1]])  # the start token leads, as in transformers' decoder ids
    hf = RepetitionPenaltyLogitsProcessor(1.3)(ids, torch.tensor(scores)).numpy()
    np.testing.assert_allclose(out, hf, rtol=1e-6)


def test_repetition_penalty_stops_repeated_tokens(tiny_model):
    src, mask = _src()
    bias = np.zeros(tiny_model.config.vocab_size, dtype=np.float32)
    bias[[2000, 2001]] = 50.0  # as above: without a penalty decoding loops on these two
    tiny_model.decoder.lm_head.bias = mx.array(bias)
    for beams in (1, 3):
        cfg = DecodingConfig(max_length=12, num_beams=beams, no_repeat_ngram_size=0, repetition_penalty=1000.0)
        for h in generate(tiny_model, src, mask, cfg):
            assert len(h.tokens) == len(set(h.tokens)), h.tokens


def test_min_and_max_length(tiny_model):
    src, mask = _src()
    for beams in (1, 2):
        for h in generate(tiny_model, src, mask, DecodingConfig(max_length=5, min_length=5, num_beams=beams)):
            assert len(h.tokens) == 5 and h.finish_reason == "length"


def test_sampling_is_reproducible_with_a_seed(tiny_model):
    src, mask = _src()
    cfg = DecodingConfig(max_length=10, do_sample=True, temperature=1.5, top_k=50, top_p=0.9, seed=7)
    a = generate(tiny_model, src, mask, cfg)
    b = generate(tiny_model, src, mask, cfg)
    assert [h.tokens for h in a] == [h.tokens for h in b]
    c = generate(tiny_model, src, mask, DecodingConfig(max_length=10, do_sample=True, temperature=1.5, seed=8))
    assert [h.tokens for h in a] != [h.tokens for h in c]


def test_top_k_one_is_greedy(tiny_model):
    src, mask = _src()
    greedy = generate(tiny_model, src, mask, DecodingConfig(max_length=8))
    sampled = generate(tiny_model, src, mask, DecodingConfig(max_length=8, do_sample=True, top_k=1, seed=3))
    assert [h.tokens for h in greedy] == [h.tokens for h in sampled]


@pytest.mark.parametrize(
    "bad",
    [dict(num_beams=0), dict(max_length=5, min_length=10), dict(top_p=0.0), dict(top_p=1.5), dict(temperature=-1.0),
     dict(max_length=0), dict(do_sample=True, num_beams=2), dict(repetition_penalty=0.0), dict(repetition_penalty=-1.0),
     dict(coverage_penalty=-1.0), dict(coverage_penalty=float("inf"))],
)
def test_invalid_settings_raise_one_sentence(bad):
    with pytest.raises(DecodingError) as e:
        DecodingConfig(**bad)
    assert isinstance(e.value, ValueError) and str(e.value).endswith(".")


@pytest.mark.parametrize(
    "bad, name",
    [(dict(num_beams="4"), "num_beams"), (dict(max_length=5.0), "max_length"), (dict(temperature="1"), "temperature"),
     (dict(do_sample="yes"), "do_sample"), (dict(num_beams=True), "num_beams"), (dict(seed="7"), "seed"),
     (dict(do_sample=True, num_beams="2"), "num_beams"), (dict(min_length=None), "min_length")],
)
def test_wrong_types_name_the_setting(bad, name):
    with pytest.raises(DecodingError, match=name) as e:
        DecodingConfig(**bad)
    assert str(e.value).endswith(".")


def test_unknown_setting_lists_the_valid_ones():
    with pytest.raises(DecodingError, match="'beams'") as e:
        DecodingConfig.from_kwargs(beams=4)
    assert "num_beams" in str(e.value) and "max_length" in str(e.value)
    assert DecodingConfig.from_kwargs(num_beams=2).num_beams == 2


def test_lengths_past_the_position_table_raise_before_decoding(tiny_model):
    src, mask = _src()
    limit = tiny_model.config.max_positions
    with pytest.raises(DecodingError, match=f"at most {limit}"):
        generate(tiny_model, src, mask, DecodingConfig(max_length=limit + 1))
    with pytest.raises(DecodingError, match="max_length"):
        decode_stream(tiny_model, src, mask, DecodingConfig(max_length=limit + 1))  # at the call, not at next()
    long_src = mx.full((1, limit + 1), 2000, dtype=mx.int32)
    with pytest.raises(DecodingError, match=f"{limit + 1} tokens"):
        generate(tiny_model, long_src, None, DecodingConfig(max_length=4))
    decode_stream(tiny_model, src, mask, DecodingConfig(max_length=limit))  # the whole table is fine


def test_decoding_ignores_and_restores_training_mode(tiny_config):
    mx.random.seed(0)
    model = Bert2Bert(tiny_config.replace(dropout=0.5))
    src, mask = _src()
    model.eval()
    for cfg in (DecodingConfig(max_length=8, no_repeat_ngram_size=0), DecodingConfig(max_length=8, num_beams=2)):
        expected = [h.tokens for h in generate(model, src, mask, cfg)]
        model.train()
        for _ in range(2):  # dropout at p=0.5 would change these
            assert [h.tokens for h in generate(model, src, mask, cfg)] == expected
            assert model.training
        model.eval()
        generate(model, src, mask, cfg)
        assert not model.training


@pytest.mark.parametrize("share", [False, True])
def test_compiled_decoding_sees_new_weights(tiny_config, share, monkeypatch):
    """The compiled step multiplies by (in, out) copies of the weights (and the C step, which is
    the compiled path where it applies, by views of them): after an update (as an optimizer
    makes mid-run) they must be taken afresh, or decoding would use stale weights."""
    mx.random.seed(1)
    model = Bert2Bert(tiny_config.replace(share_encoder_decoder=share))
    model.eval()
    src, mask = _src()
    cfg = DecodingConfig(max_length=10, no_repeat_ngram_size=0)
    before = [h.tokens for h in generate(model, src, mask, cfg)]
    from mlx.utils import tree_map

    mx.random.seed(2)
    model.update(tree_map(lambda w: w + 0.5 * mx.random.normal(w.shape), model.parameters()))
    after = [h.tokens for h in generate(model, src, mask, cfg)]
    monkeypatch.setenv("B2B_COMPILE_DECODE", "0")
    assert after == [h.tokens for h in generate(model, src, mask, cfg)]
    assert after != before  # the update did change the summary, so the check above means something


def test_the_decoding_copy_of_the_output_matrix_is_kept_only_while_serving(tiny_model, monkeypatch):
    monkeypatch.setenv("B2B_CPU_STEP", "0")  # the copy is the MLX step's (the C step reads the table itself)
    h = mx.random.normal((3, tiny_model.config.hidden_size))
    table_t = mx.contiguous(tiny_model.output_matrix().T)
    assert np.allclose(np.array(tiny_model.lm_logits(h, table_t)), np.array(tiny_model.lm_logits(h)), atol=1e-5)
    src, mask = _src()
    tiny_model.train()
    generate(tiny_model, src, mask, DecodingConfig(max_length=4))
    assert "_b2b_output_t" not in tiny_model.__dict__  # a training run does not keep the copy
    tiny_model.eval()
    generate(tiny_model, src, mask, DecodingConfig(max_length=4))
    assert "_b2b_output_t" in tiny_model.__dict__  # serving keeps it between calls


def test_word_pieces_find_the_word_that_would_stutter(tokenizer):
    from b2b.decoding import WordPieces

    ids = lambda text: tokenizer.encode(text, add_special_tokens=False).ids  # noqa: E731
    words = WordPieces(tokenizer.continues_word, frozenset({tokenizer.token_id(","), tokenizer.token_id("and")}))
    comma, texas = tokenizer.token_id(","), tokenizer.token_id("texas")
    assert words.stutters([]) == [] and words.stutters(ids(",")) == [comma]
    assert words.stutters(ids("in texas")) == [texas]
    assert words.stutters(ids("in texas ,")) == [comma, texas]  # neither "texas, texas" nor ", ,"
    assert words.stutters(ids("india and")) == ids("and") + ids("india")  # "india and india"
    # A word of several pieces: its first piece may not start it again.
    pieces = ids("in gorbachev")
    assert len(pieces) > 2 and words.stutters(pieces) == [pieces[1]]
    assert tokenizer.continues_word[pieces[-1]] and not tokenizer.continues_word[pieces[1]]


def test_word_pieces_find_the_phrase_that_would_stutter(tokenizer):
    from b2b.decoding import WordPieces

    ids = lambda text: tokenizer.encode(text, add_special_tokens=False).ids  # noqa: E731
    first = lambda word: ids(word)[0]  # noqa: E731
    words = WordPieces(tokenizer.continues_word, frozenset({tokenizer.token_id(","), tokenizer.token_id("and")}))
    # Directly: "city beach city" may not go on with "beach" (nor "city", a word after itself).
    assert words.stutters(ids("at city beach city")) == [first("city"), first("beach")]
    assert first("beach") not in words.stutters(ids("at city beach town"))
    # Across the last joiner: "march 7, march" -> not "7"; "new york and new" -> not "york".
    assert first("7") in words.stutters(ids("on march 7 , march"))
    assert first("york") in words.stutters(ids("in new york and new"))
    assert first("york") not in words.stutters(ids("in new york and old"))
    assert first("jersey") not in words.stutters(ids("in new york and new"))
    # Three words, one of several pieces.
    phrase = "gorbachev said it"
    assert first("it") in words.stutters(ids(f"then {phrase} , gorbachev said"))
    # Phrases longer than `span` words are not checked; the copy must follow at once.
    long = "one two three four five"
    assert first("five") not in words.stutters(ids(f"{long} , one two three four"))
    assert first("four") in words.stutters(ids("one two three four , one two three"))
    assert first("7") not in words.stutters(ids("on march 7 , then march"))


def test_summarize_bans_the_phrases_small_models_repeat_across_of_and_or(tokenizer):
    from b2b.decoding import WordPieces

    ids = lambda text: tokenizer.encode(text, add_special_tokens=False).ids  # noqa: E731
    first = lambda word: ids(word)[0]  # noqa: E731
    words = WordPieces.of(tokenizer)  # as summarize() builds it
    assert first("video") in words.stutters(ids("he saw the video of the"))  # "the video of the video"
    assert first("causes") in words.stutters(ids("from natural causes of natural"))
    assert first("legal") in words.stutters(ids("it is legal or"))  # "legal or legal"
    assert first("illegal") not in words.stutters(ids("it is legal or"))
    # Idioms repeat across the others: "face to face", "side by side" stay possible.
    assert first("face") not in words.stutters(ids("they met face to"))
    assert first("side") not in words.stutters(ids("they stood side by"))


def test_word_pieces_ban_a_pair_of_content_words_coming_twice_in_a_sentence(tokenizer):
    from b2b.decoding import WordPieces

    ids = lambda text: tokenizer.encode(text, add_special_tokens=False).ids  # noqa: E731
    first = lambda word: ids(word)[0]  # noqa: E731
    words = WordPieces.of(tokenizer)  # as summarize() builds it
    assert words.repeats(ids("police say the man was police")) == [first("say")]
    assert words.repeats(ids("ted cruz says he will meet ted")) == [first("cruz")]
    assert first("cruz") in words.banned(ids("ted cruz says he will meet ted"))
    # Names of several pieces: "gorbachev said ... gorbachev" may not go on with "said".
    assert words.repeats(ids("gorbachev said it was gorbachev")) == [first("said")]
    assert words.repeats(ids("gorbachev said it was gorb")) == []  # "gorb" is not "gorbachev"
    # Pairs with a function word or punctuation are how sentences are built: allowed.
    assert words.repeats(ids("the president met the")) == []  # "the president"
    assert words.repeats(ids("police in the city and police")) == []  # "police in"
    assert words.repeats(ids("police , then police")) == []  # "police ,"
    # Only within the sentence being written: a new sentence may name the pair again.
    assert words.repeats(ids("police say it . police")) == []
    assert words.repeats(ids("he left . police say it was police")) == [first("say")]
    assert words.repeats([]) == []


def test_no_repeat_word_stops_a_word_following_itself(tiny_model, tokenizer):
    from b2b.decoding import WordPieces

    src, mask = _src()
    texas, comma = tokenizer.token_id("texas"), tokenizer.token_id(",")
    bias = np.zeros(tiny_model.config.vocab_size, dtype=np.float32)
    bias[texas], bias[comma] = 60.0, 50.0  # without the rule: "texas texas texas ..."
    tiny_model.decoder.lm_head.bias = mx.array(bias)
    words = WordPieces(tokenizer.continues_word, frozenset({comma}))
    for beams in (1, 3):
        loose = DecodingConfig(max_length=12, num_beams=beams, no_repeat_ngram_size=0, no_repeat_word=False)
        assert all(h.tokens[:2] == [texas, texas] for h in generate(tiny_model, src, mask, loose, words))
        strict = DecodingConfig(max_length=12, num_beams=beams, no_repeat_ngram_size=0)
        for h in generate(tiny_model, src, mask, strict, words):
            assert texas in h.tokens
            for i in range(1, len(h.tokens)):
                assert not (h.tokens[i] == h.tokens[i - 1] and not words.continues[h.tokens[i]]), h.tokens
                assert not (h.tokens[i - 1] == comma and i >= 2 and h.tokens[i] == h.tokens[i - 2]), h.tokens
        # Without word pieces (a bare generate call), the rule cannot apply.
        assert generate(tiny_model, src, mask, strict)[0].tokens[:2] == [texas, texas]
