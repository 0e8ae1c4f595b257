"""One type check for the settings dataclasses (B2BConfig, DecodingConfig), run before any
range check: `num_beams="4"` or a config.json `"hidden_size": "big"` becomes a sentence naming
the setting, not a TypeError from comparing a str with an int."""
from __future__ import annotations

import dataclasses
import numbers

import numpy as np

_WORDS = {"int": "a whole number", "float": "a number", "bool": "true or false"}


def _fits(value: object, kind: str) -> bool:
    if isinstance(value, (bool, np.bool_)):
        return kind == "bool"  # True is an int to Python, but never a count or a temperature here
    if kind == "int":
        return isinstance(value, numbers.Integral)
    return kind == "float" and isinstance(value, numbers.Real)


def type_problem(obj: object) -> str | None:
    """The first field of dataclass `obj` whose value does not fit its annotation (`int`,
    `float`, `bool`, optionally `| None`; annotations are strings under `from __future__
    import annotations`), as a sentence; None when all fit. Other annotations are not checked."""
    for f in dataclasses.fields(obj):
        kind, optional = str(f.type).removesuffix(" | None"), str(f.type).endswith(" | None")
        value = getattr(obj, f.name)
        if kind not in _WORDS or (optional and value is None) or _fits(value, kind):
            continue
        return f"{f.name} must be {_WORDS[kind]}{' or None' if optional else ''}, got {value!r} ({type(value).__name__})."
    return None
