"""Benchmarks of b2b against Hugging Face transformers (PyTorch) with the same architecture and
the same weights. Scripts that print tables, not timed tests: `python -m bench.compare [--quick]`.
torch and transformers are needed here only, never by `b2b` at run time."""
