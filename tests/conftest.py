"""Shared fixtures: tiny configs (2 layers x 32 dims), the bundled tokenizer, paths to
../shared data (tests that need it skip with a reason where it is absent)."""
from __future__ import annotations

import os
from pathlib import Path

# Never reach for the hub in tests: it only fails after ~25 s of retries here.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402

import b2b  # noqa: E402,F401 - preloads the BLAS before mlx.core
import mlx.core as mx  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures"
SHARED = Path(os.environ.get("B2B_SHARED", REPO.parent / "shared"))
MINILM = SHARED / "models" / "minilm-l6-h384-uncased"


def need_shared(*parts: str) -> Path:
    """Path under ../shared, or skip the test with the reason."""
    path = SHARED.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"needs {path} (the project's shared data; present on dev machines and in CI)")
    return path


@pytest.fixture
def tiny_config():
    from b2b import B2BConfig

    return B2BConfig.preset("tiny", dropout=0.0)


@pytest.fixture
def tiny_model(tiny_config):
    from b2b import Bert2Bert

    mx.random.seed(0)
    model = Bert2Bert(tiny_config)
    model.eval()
    return model


@pytest.fixture(scope="session")
def tokenizer():
    from b2b import Tokenizer

    return Tokenizer.default()


@pytest.fixture(scope="session")
def cnndm_rows():
    import json

    with open(FIXTURES / "cnndm_sample.jsonl") as f:
        return [json.loads(line) for line in f]
