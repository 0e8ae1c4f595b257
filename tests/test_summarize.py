"""Text in, summary out: validation, truncation notice, streaming, attention maps, truecasing."""
import numpy as np
import pytest

from b2b import InputError, stream_summarize, summarize
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
