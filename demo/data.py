"""Bundled text: example articles for the Summarize tab, the sample set for ROUGE."""
from __future__ import annotations

import json
import os

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
EXAMPLES_FILE = os.path.join(HERE, "examples.jsonl")  # 5 CNN/DM validation articles
SAMPLE_SET = os.path.join(REPO, "tests", "fixtures", "cnndm_sample.jsonl")  # 300 of them
SAMPLE_SIZE = 300


def load_examples(path: str = EXAMPLES_FILE) -> list[dict]:
    """The example articles (`{"id", "article", "highlights"}` per line); [] if unreadable."""
    try:
        with open(path, encoding="utf-8") as f:
            return [json.loads(line) for line in f if line.strip()]
    except (OSError, ValueError):
        return []


def example_label(article: str, words: int = 9) -> str:
    """The first words of an article, for an example button."""
    text = article.replace("(CNN)", "").strip()
    return " ".join(text.split()[:words]) + " …"
