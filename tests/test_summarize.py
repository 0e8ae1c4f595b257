"""Text in, summary out: validation, truncation notice, streaming, attention maps, truecasing."""
import importlib

import mlx.core as mx
import numpy as np
import pytest

from b2b import Bert2Bert, DecodingError, InputError, stream_summarize, summarize
from b2b.truecase import truecase


def test_summarize_result_fields(tiny_model, tokenizer):
    r = summarize(tiny_model, tokenizer, "The cat sat on the mat. It was happy.", max_length=6)
    assert isinstance(r.text, str) and len(r.token_ids) <= 6
    assert r.finish_reason in ("eos", "length") and not r.truncated
    assert r.num_input_tokens == len(tokenizer.encode("The cat sat on the mat. It was happy.").ids)
    assert r.seconds > 0 and r.tokens_per_sec > 0


def test_long_input_is_truncated_and_says_so(tiny_model, tokenizer, cnndm_rows):
    article = cnndm_rows[0]["article"]
    r = summarize(tiny_model, tokenizer, article, max_length=4)
    assert r.truncated and r.num_input_tokens > tiny_model.config.max_positions


@pytest.mark.parametrize("bad", ["", "   \n\t", None, 42, b"bytes"])
def test_bad_input_raises_one_sentence(tiny_model, tokenizer, bad):
    with pytest.raises(InputError) as e:
        summarize(tiny_model, tokenizer, bad)
    assert isinstance(e.value, ValueError) and str(e.value).endswith(".")


def test_invalid_decoding_setting_is_a_value_error(tiny_model, tokenizer):
    with pytest.raises(ValueError, match="num_beams"):
        summarize(tiny_model, tokenizer, "Some text.", num_beams=0)


def test_stream_grows_and_ends_with_the_result(tiny_model, tokenizer):
    chunks = list(stream_summarize(tiny_model, tokenizer, "A storm hit the coast on Monday.", max_length=8, no_repeat_ngram_size=0))
    final = chunks[-1].result
    assert final is not None and all(c.result is None for c in chunks[:-1])
    lengths = [len(c.token_ids) for c in chunks[:-1]]
    assert lengths == sorted(lengths) and lengths[-1] == len(final.token_ids)
    assert final.text == summarize(tiny_model, tokenizer, "A storm hit the coast on Monday.", max_length=8, no_repeat_ngram_size=0).text


def test_batch_of_texts(tiny_model, tokenizer, cnndm_rows):
    texts = [cnndm_rows[1]["article"][:300], "Short one."]
    results = summarize(tiny_model, tokenizer, texts, max_length=5, num_beams=2)
    assert len(results) == 2
    assert results[1].text == summarize(tiny_model, tokenizer, "Short one.", max_length=5, num_beams=2).text


def test_attention_maps_shapes_and_rows(tiny_model, tokenizer):
    r = summarize(tiny_model, tokenizer, "Officials said the bridge will reopen next week.", max_length=6, return_attention=True)
    a = r.attentions
    L, H = tiny_model.config.encoder_layers, tiny_model.config.num_heads
    S, T = len(a.source_tokens), len(a.summary_tokens)
    assert a.source_tokens[0] == "[CLS]" and a.source_tokens[-1] == "[SEP]"
    assert a.encoder.shape == (L, H, S, S) and a.decoder.shape == (L, H, T, T) and a.cross.shape == (L, H, T, S)
    assert np.allclose(a.cross.astype(np.float32).sum(-1), 1.0, atol=1e-2)
    assert np.allclose(np.triu(a.decoder[0, 0].astype(np.float32), 1), 0.0)
    assert T == len(r.token_ids) + (r.finish_reason == "eos")


def test_truecase_restores_names_from_the_source():
    source = "Rory McIlroy threw a club. The club landed in the water, McIlroy said at the WGC event."
    assert truecase("Rory mcilroy threw his club at the wgc event.", source) == "Rory McIlroy threw his club at the WGC event."
    assert truecase("The club sank.", source) == "The club sank."  # sentence-start capitals stay
    # possessives: the source's "Italy's" cases "italy", its "France" cases "france's"
    src = "Officials met Italy's leader. He flew to France on Monday."
    assert truecase("The leader of italy visited france's capital.", src) == "The leader of Italy visited France's capital."
    # Parts of a hyphenated name keep its casing when the summary copies one alone.
    assert truecase("He was seen in the radnor area.", "Seen in the Radnor-Wayne area.") == "He was seen in the Radnor area."
    assert truecase("A self-made man.", "He is a self-made man.") == "A self-made man."  # common words stay lowercase
    # After a title's or an initial's full stop a name is not at a sentence start: it counts.
    src = "The Army will charge Sgt. Bowe Bergdahl. Dr. Sanjay Gupta and John F. Kennedy spoke."
    assert truecase("sgt. bowe bergdahl met dr. sanjay gupta near kennedy airport.", src) == (
        "Sgt. Bowe Bergdahl met dr. Sanjay Gupta near Kennedy airport."  # "Dr." only starts a sentence there
    )
    assert truecase("The army spoke.", "He left. Army officials spoke.") == "The army spoke."  # a sentence's start still does not count
    # A sentence can end in "U.S." or "a.m.": the word after is a sentence start there.
    src = "He fled to the U.S. Authorities are searching. He was seen at 10 a.m. Police arrived, and police said more."
    assert truecase("authorities say police are searching.", src) == "authorities say police are searching."


def test_tokenizer_bigger_than_the_model_vocabulary_is_refused(tiny_config, tokenizer):
    model = Bert2Bert(tiny_config.replace(vocab_size=1000))
    with pytest.raises(InputError, match="30522.*1000") as e:
        summarize(model, tokenizer, "Some text.", max_length=4)
    assert str(e.value).endswith(".")


@pytest.mark.parametrize("bad", [0, -5, 2, "64", 12.5, True])
def test_bad_max_source_length_raises(tiny_model, tokenizer, bad):
    with pytest.raises(InputError, match="max_source_length"):
        summarize(tiny_model, tokenizer, "Some text.", max_source_length=bad, max_length=4)


def test_max_source_length_none_and_beyond_the_table(tiny_model, tokenizer, cnndm_rows):
    article = cnndm_rows[0]["article"]
    default = summarize(tiny_model, tokenizer, article, max_length=4)
    short = summarize(tiny_model, tokenizer, article, max_source_length=16, max_length=4)
    huge = summarize(tiny_model, tokenizer, article, max_source_length=10_000, max_length=4)  # capped, says truncated
    assert short.truncated and huge.truncated and huge.token_ids == default.token_ids


def test_too_long_a_summary_for_the_positions_raises(tiny_model, tokenizer):
    limit = tiny_model.config.max_positions
    with pytest.raises(DecodingError, match=f"at most {limit}"):
        summarize(tiny_model, tokenizer, "Some text.", max_length=limit + 1)


def test_unknown_and_wrongly_typed_settings_are_value_errors(tiny_model, tokenizer):
    with pytest.raises(DecodingError, match="num_beams"):
        summarize(tiny_model, tokenizer, "Some text.", beams=4)
    with pytest.raises(DecodingError, match="num_beams"):
        summarize(tiny_model, tokenizer, "Some text.", num_beams="4")


def test_summaries_ignore_dropout_and_restore_training_mode(tiny_config, tokenizer):
    mx.random.seed(0)
    model = Bert2Bert(tiny_config.replace(dropout=0.5))
    text = "Officials said the bridge will reopen next week after repairs."
    model.eval()
    expected = summarize(model, tokenizer, text, max_length=8, return_attention=True)
    model.train()
    for _ in range(2):
        r = summarize(model, tokenizer, text, max_length=8, return_attention=True)
        assert r.token_ids == expected.token_ids and np.array_equal(r.attentions.cross, expected.attentions.cross)
        assert [c.token_ids for c in stream_summarize(model, tokenizer, text, max_length=8)][-1] == expected.token_ids
        assert model.training


def test_stream_validates_at_the_call(tiny_model, tokenizer):
    for kwargs in (dict(text=""), dict(text=42), dict(text="Fine.", num_beams=0), dict(text="Fine.", max_length=10_000),
                   dict(text="Fine.", max_source_length=0)):
        text = kwargs.pop("text")
        with pytest.raises(ValueError):
            stream_summarize(tiny_model, tokenizer, text, **kwargs)  # never iterated


@pytest.mark.parametrize("beams", [1, 3])
def test_stream_chunks_carry_token_delta_and_finished(tiny_model, tokenizer, beams):
    chunks = list(stream_summarize(tiny_model, tokenizer, "A storm hit the coast on Monday.", max_length=8, num_beams=beams))
    text = ""
    for c in chunks:
        assert 0 <= c.rewind <= len(text)
        text = text[: len(text) - c.rewind] + c.delta
        assert text == c.text
    for prev, c in zip([None] + chunks, chunks[:-1]):
        grew = len(c.token_ids) > len(prev.token_ids if prev else [])
        assert c.token == (c.token_ids[-1] if grew else (tiny_model.config.sep_id if c.finished else None))
    assert chunks[-1].finished and chunks[-1].result is not None and chunks[-1].text == chunks[-1].result.text
    assert not any(c.finished for c in chunks[:-2])


def test_summarize_decodes_text_once_and_builds_casing_once(tiny_model, tokenizer, monkeypatch):
    module = importlib.import_module("b2b.summarize")  # `b2b.summarize` the attribute is the function

    calls = {"decode": 0, "table": 0}
    real_decode, real_table = type(tokenizer).decode, module.casing_table

    def decode(self, ids, skip_special_tokens=True):
        calls["decode"] += 1
        return real_decode(self, ids, skip_special_tokens)

    def table(source):
        calls["table"] += 1
        return real_table(source)

    monkeypatch.setattr(type(tokenizer), "decode", decode)
    monkeypatch.setattr(module, "casing_table", table)
    text = "A storm hit the coast on Monday."
    r = summarize(tiny_model, tokenizer, text, max_length=8, no_repeat_ngram_size=0)
    assert calls == {"decode": 1, "table": 1} and len(r.token_ids) >= 2
    calls.update(decode=0, table=0)
    chunks = list(stream_summarize(tiny_model, tokenizer, text, max_length=8, no_repeat_ngram_size=0))
    assert calls["table"] == 1 and calls["decode"] == len(chunks)  # one per step, then the result


def test_attention_maps_take_a_plain_list_of_source_ids(tiny_model, tokenizer):
    from b2b import attention_maps

    ids = tokenizer.encode("Officials said the bridge will reopen.", max_length=32).ids
    from_list = attention_maps(tiny_model, tokenizer, ids, [2000, 2001], ended=True)
    from_array = attention_maps(tiny_model, tokenizer, mx.array([ids], dtype=mx.int32), [2000, 2001], ended=True)
    assert from_list.source_tokens == from_array.source_tokens
    assert np.array_equal(from_list.cross, from_array.cross)


def test_summaries_do_not_stutter_unless_asked(tiny_model, tokenizer):
    texas = tokenizer.token_id("texas")
    bias = np.zeros(tiny_model.config.vocab_size, dtype=np.float32)
    bias[texas] = 60.0  # the model now wants "texas texas texas ..."
    tiny_model.decoder.lm_head.bias = mx.array(bias)
    article = "Storms hit Texas on Monday."
    assert summarize(tiny_model, tokenizer, article, max_length=6, no_repeat_word=False).token_ids[:2] == [texas, texas]
    for beams in (1, 2):
        ids = summarize(tiny_model, tokenizer, article, max_length=6, num_beams=beams).token_ids
        assert texas in ids and all(a != b for a, b in zip(ids, ids[1:])), ids


def test_the_trained_source_length_is_what_decoding_reads_by_default(tiny_model, tokenizer, cnndm_rows):
    """A model trained on 16-token sources reads 16 by default (its checkpoint's decoding.json);
    an explicit max_source_length still wins, and None trained length means every position."""
    article = cnndm_rows[0]["article"]
    everything = summarize(tiny_model, tokenizer, "A short note about a fire downtown.", max_length=4)
    assert not everything.truncated and tiny_model.source_limit == tiny_model.config.max_positions
    cut = summarize(tiny_model, tokenizer, article, max_source_length=16, max_length=6, return_attention=True)
    tiny_model.trained_source_length = 16
    try:
        trained = summarize(tiny_model, tokenizer, article, max_length=6, return_attention=True)
        wider = summarize(tiny_model, tokenizer, article, max_source_length=40, max_length=6, return_attention=True)
    finally:
        tiny_model.trained_source_length = None
    assert trained.token_ids == cut.token_ids and trained.truncated
    assert len(trained.attentions.source_tokens) == len(cut.attentions.source_tokens) == 16
    assert len(wider.attentions.source_tokens) == 40
