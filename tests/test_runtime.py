"""The package's import-time promises: fast BLAS on Linux, no UI/logging libraries pulled in."""
import os
import platform
import subprocess
import sys

import numpy as np
import pytest

import b2b


def test_runtime_info_fields():
    info = b2b.runtime_info()
    for key in ("mlx", "device", "blas"):
        assert info[key]
    assert "device_name" in info  # the GPU's or CPU's name where MLX can say (model cards name it)


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


def _shim_expected() -> bool:
    """Linux, OpenBLAS and a C compiler: where b2b builds the gemv shim."""
    import shutil

    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    return platform.system() == "Linux" and b2b.runtime_info()["blas"] == "openblas" and bool(compiler)


needs_shim = pytest.mark.skipif(not _shim_expected(), reason="the gemv shim is built only for OpenBLAS on Linux with a C compiler")


def _run_in_fresh_process(code: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={**os.environ, **env}, timeout=120)


@needs_shim
def test_gemv_shim_is_in_front_of_openblas():
    from b2b import gemv_shim

    if not gemv_shim.enabled():
        pytest.skip("B2B_GEMV_SHIM turns it off in this environment")
    assert b2b.runtime_info()["gemv_shim"] is True


@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 9])
def test_small_row_matmuls_are_exact_in_every_layout(rows):
    # With the shim, products of at most 4 rows go to sgemv (row by row); every transpose
    # combination MLX can hand BLAS must still give the product.
    import mlx.core as mx

    rng = np.random.default_rng(rows)
    for k, n in ((384, 1536), (1536, 384), (32, 200)):
        a = rng.standard_normal((rows, k)).astype(np.float32)
        w = rng.standard_normal((n, k)).astype(np.float32)
        want = a.astype(np.float64) @ w.T.astype(np.float64)
        A, W = mx.array(a), mx.array(w)
        At = mx.contiguous(A.T).T  # the same values, handed over transposed
        for name, got in (
            ("x @ W.T", A @ W.T),
            ("x @ contiguous(W.T)", A @ mx.contiguous(W.T)),
            ("transposed x", At @ W.T),
            ("addmm", mx.addmm(mx.full((n,), 2.0), A, W.T, alpha=0.5, beta=3.0)),
        ):
            expect = want if name != "addmm" else 0.5 * want + 6.0
            np.testing.assert_allclose(np.array(got), expect, rtol=1e-4, atol=1e-3, err_msg=name)
    # Batched (per-head) products of one query row, as a decoding step's attention makes them.
    q = rng.standard_normal((2, 3, rows, 8)).astype(np.float32)
    kk = rng.standard_normal((2, 3, 40, 8)).astype(np.float32)
    got = np.array(mx.array(q) @ mx.array(kk).swapaxes(-1, -2))
    np.testing.assert_allclose(got, q @ kk.swapaxes(-1, -2), rtol=1e-4, atol=1e-4)


def test_gemv_shim_can_be_turned_off():
    proc = _run_in_fresh_process("import b2b, json; print(json.dumps(b2b.runtime_info()['gemv_shim']))", B2B_GEMV_SHIM="0")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "false"


_MATMUL_AND_FLAG = (
    "import b2b, mlx.core as mx, numpy as np; a = np.arange(6, dtype=np.float32).reshape(1, 6); "
    "w = np.ones((5, 6), np.float32); assert np.allclose(np.array(mx.array(a) @ mx.array(w).T), a @ w.T); "
    "print(b2b.runtime_info()['gemv_shim'])"
)


@needs_shim
def test_gemv_shim_is_built_into_a_private_cache_folder(tmp_path):
    proc = _run_in_fresh_process(_MATMUL_AND_FLAG, XDG_CACHE_HOME=str(tmp_path), B2B_GEMV_SHIM="1")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "True"
    folder = tmp_path / "b2b"
    files = list(folder.iterdir())
    # Builds and the OpenBLAS core-type answer (openblas_core), no temporary files left behind.
    assert {p.suffix for p in files} <= {".so", ".txt"} and ".so" in {p.suffix for p in files}
    assert any(p.name.startswith("gemv_shim-") for p in files)
    assert folder.stat().st_mode & 0o077 == 0


@needs_shim
def test_a_broken_cached_shim_falls_back_to_plain_blas(tmp_path):
    # A file under the shim's name that is not the shim must not crash `import b2b` (nor abort
    # at the first matmul): b2b runs on the BLAS alone and says so.
    from b2b import gemv_shim

    folder = tmp_path / "b2b"
    folder.mkdir(mode=0o700)
    (folder / gemv_shim.library_name()).write_bytes(b"not a library")
    proc = _run_in_fresh_process(_MATMUL_AND_FLAG, XDG_CACHE_HOME=str(tmp_path), B2B_GEMV_SHIM="1")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "False"


def test_a_folder_others_can_write_is_not_used(tmp_path):
    from b2b import native

    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    assert not native._private_folder(str(shared))
    private = tmp_path / "private"
    assert native._private_folder(str(private))


def test_a_failed_build_is_remembered_until_retried(tmp_path, monkeypatch):
    import subprocess

    from b2b import native

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    calls = []

    def broken(path):
        calls.append(path)
        raise subprocess.CalledProcessError(1, ["cc"])

    assert native.cached("thing.so", broken) is None
    assert native.cached("thing.so", broken) is None and len(calls) == 1  # not retried at every start
    assert (tmp_path / "b2b" / "thing.so.failed").exists()

    def works(path):
        calls.append(path)
        with open(path, "w") as f:
            f.write("built")

    out = native.cached("thing.so", works, retry=True)  # setup.sh's build tries again
    assert out and open(out).read() == "built" and not (tmp_path / "b2b" / "thing.so.failed").exists()

    def no_tools(path):
        raise OSError("cmake not found")

    assert native.cached("other.so", no_tools) is None
    assert not (tmp_path / "b2b" / "other.so.failed").exists()  # installing the tool is enough


def test_tune_malloc_applies_on_glibc_and_can_be_turned_off(monkeypatch):
    import platform

    from b2b import runtime

    if platform.system() == "Linux" and platform.libc_ver()[0] == "glibc":
        assert runtime.tune_malloc() is True
    monkeypatch.setenv("B2B_TUNE_MALLOC", "0")
    assert runtime.tune_malloc() is False
