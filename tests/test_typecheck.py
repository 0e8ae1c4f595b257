"""b2b.typecheck: the one type check behind B2BConfig and DecodingConfig."""
import numpy as np
import pytest

from b2b import B2BConfig, ConfigError, DecodingConfig, DecodingError


@pytest.mark.parametrize("kwargs, words", [
    ({"num_beams": "4"}, "num_beams must be a whole number, got '4'"),
    ({"num_beams": True}, "num_beams must be a whole number"),  # a bool is not a count
    ({"temperature": "1"}, "temperature must be a number"),
    ({"do_sample": "yes"}, "do_sample must be true or false"),
    ({"seed": 1.5}, "seed must be a whole number or None"),
])
def test_decoding_settings_of_the_wrong_type_are_one_sentence(kwargs, words):
    with pytest.raises(DecodingError, match=words):
        DecodingConfig(**kwargs)


def test_fitting_values_pass_including_numpy_bools_and_none():
    DecodingConfig(do_sample=np.bool_(True), seed=None, temperature=1)  # an int is a number
    with pytest.raises(ConfigError, match="hidden_size must be a whole number, got 'big'"):
        B2BConfig(hidden_size="big")
