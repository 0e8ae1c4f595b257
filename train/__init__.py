"""Training: data loading and batching, losses, the compiled loop, evaluation and metric writing."""
import b2b  # noqa: F401 - first, so the fast BLAS is preloaded before anything imports mlx.core
