"""The b2b Gradio app and command line: one module per tab (`tab_*.py`), the hot-reloading
checkpoint store (`store.py`), input checks (`validate.py`), plotly figures (`figures.py`).
Start it with `python app.py`; the text prompt is `python -m demo.cli`."""

import b2b  # noqa: F401 - first, so the fast BLAS is loaded before any demo module imports mlx
