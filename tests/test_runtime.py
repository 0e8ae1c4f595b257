"""The package's import-time promises: fast BLAS on Linux, no UI/logging libraries pulled in."""
import platform
import subprocess
import sys

import b2b


def test_runtime_info_fields():
    info = b2b.runtime_info()
    for key in ("mlx", "device", "blas"):
        assert info[key]


def test_linux_uses_an_optimized_blas():
    if platform.system() != "Linux":
        return
    info = b2b.runtime_info()
    assert info["blas"] in ("openblas", "mkl", "B2B_BLAS"), (
        f"MLX runs on the slow reference BLAS ({info['blas']}): install libopenblas0-pthread or mkl"
    )


def test_import_b2b_pulls_in_no_gradio_or_tensorboardx():
    code = "import sys, b2b; bad = [m for m in ('gradio', 'tensorboardX', 'torch') if m in sys.modules]; print(bad); sys.exit(1 if bad else 0)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
