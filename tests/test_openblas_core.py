"""OpenBLAS runs kernels as wide as the CPU allows, even when it does not know the CPU model."""
import json
import os
import platform
import subprocess
import sys

import pytest

import b2b
from b2b import openblas_core

AVX512 = {"avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl", "avx2", "fma", "avx"}
AVX2 = {"avx2", "fma", "avx", "sse3"}


def test_generic_fallback_on_an_avx512_cpu_is_overridden():
    assert openblas_core.needs_override("Prescott", AVX512) == "SkylakeX"
    assert openblas_core.needs_override("Haswell", AVX512) == "SkylakeX"
    assert openblas_core.needs_override("Sandybridge", AVX2) == "Haswell"


def test_a_good_or_unknown_pick_is_kept():
    assert openblas_core.needs_override("Cooperlake", AVX512) is None
    assert openblas_core.needs_override("SkylakeX", AVX512) is None
    assert openblas_core.needs_override("Zen", AVX2) is None
    assert openblas_core.needs_override("Haswell", AVX2) is None
    assert openblas_core.needs_override("GraniteRapids", AVX512) is None  # a newer OpenBLAS's name: trusted
    assert openblas_core.needs_override("Prescott", {"sse3"}) is None  # nothing wider to offer


def test_best_family_needs_every_flag():
    assert openblas_core.best_family(AVX512) == "SkylakeX"
    assert openblas_core.best_family(AVX512 - {"avx512bw"}) == "Haswell"
    assert openblas_core.best_family({"sse2"}) is None


uses_openblas = pytest.mark.skipif(
    platform.system() != "Linux" or b2b.runtime_info()["blas"] != "openblas", reason="OpenBLAS on Linux only"
)


def _info_in_fresh_process(**env: str) -> dict:
    base = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_CORETYPE", "B2B_OPENBLAS_CORETYPE")}
    code = "import b2b, json; print(json.dumps(b2b.runtime_info()))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={**base, **env}, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


@uses_openblas
def test_openblas_kernels_match_the_cpu():
    info = _info_in_fresh_process()
    flags = openblas_core._cpu_flags()
    assert info["blas_core"], "OpenBLAS's core type is reported"
    assert openblas_core.needs_override(info["blas_core"], flags) is None, (
        f"OpenBLAS runs its {info['blas_core']} kernels on a CPU that supports {openblas_core.best_family(flags)}"
    )
    own = openblas_core.detected_core(info["blas_path"])  # the library's pick without b2b
    if info["blas_core_forced"] is None:
        assert info["blas_core"] == own, "nothing forced: the library's own pick stands"
    else:
        assert info["blas_core"].lower() == info["blas_core_forced"].lower() and own != info["blas_core"]


@uses_openblas
def test_the_setting_is_for_the_load_only():
    # Other OpenBLAS copies (NumPy's) and child processes keep their own pick.
    base = {k: v for k, v in os.environ.items() if k != "OPENBLAS_CORETYPE"}
    code = "import os, b2b; print('OPENBLAS_CORETYPE' in os.environ)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=base, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "False"


@uses_openblas
def test_a_users_coretype_is_kept():
    info = _info_in_fresh_process(OPENBLAS_CORETYPE="Sandybridge")
    assert info["blas_core"].lower() == "sandybridge" and info["blas_core_forced"] is None


@uses_openblas
def test_override_can_be_turned_off():
    info = _info_in_fresh_process(B2B_OPENBLAS_CORETYPE="0")
    assert info["blas_core_forced"] is None
