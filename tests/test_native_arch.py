"""The C kernels on this CPU and, cross-compiled and run under qemu, on aarch64: the ARM float16
branch of cpu_step.c is compiled by no x86 build, and most of our users are on ARM. The aarch64
tests need Debian's gcc-aarch64-linux-gnu and qemu-user (.ci/run installs them)."""

import shutil
import subprocess
from pathlib import Path

import pytest

from b2b import cpu_step

ROOT = Path(__file__).resolve().parents[1]
CHECK = ROOT / "tests" / "native" / "step_kernels_check.c"
FLAGS = [f for f in cpu_step._FLAGS if f != "-march=native"]  # the project's build, for any CPU
CROSS, QEMU = "aarch64-linux-gnu-gcc", "qemu-aarch64"
needs_cross = pytest.mark.skipif(
    not (shutil.which(CROSS) and shutil.which(QEMU)),
    reason=f"needs {CROSS} and {QEMU} (apt-get install gcc-aarch64-linux-gnu qemu-user)",
)


def _build_and_run(compiler: str, flags: list[str], out: Path, runner: list[str]) -> str:
    subprocess.run([compiler, *flags, str(CHECK), "-o", str(out), "-lm"], check=True, capture_output=True, text=True)
    done = subprocess.run([*runner, str(out)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


@pytest.mark.skipif(not shutil.which("cc"), reason="needs a C compiler")
def test_step_kernels_match_a_double_reference_on_this_cpu(tmp_path):
    report = _build_and_run("cc", list(cpu_step._FLAGS), tmp_path / "check", [])
    assert report.count(" ok") == 10, report


@needs_cross
def test_step_kernels_match_a_double_reference_on_aarch64(tmp_path):
    report = _build_and_run(CROSS, FLAGS, tmp_path / "check", [QEMU, "-L", "/usr/aarch64-linux-gnu"])
    # The ARM branch: 4-float NEON vectors, float16 weights read through __fp16.
    assert "vector width 4 floats, float16 weights yes" in report and report.count(" ok") == 10, report


@needs_cross
@pytest.mark.parametrize("source", sorted(p.name for p in (ROOT / "b2b").glob("*.c")))
def test_every_kernel_compiles_for_aarch64(source, tmp_path):
    done = subprocess.run(
        [CROSS, *FLAGS, "-Wall", "-Werror", "-c", str(ROOT / "b2b" / source), "-o", str(tmp_path / "k.o")],
        capture_output=True, text=True,
    )
    assert done.returncode == 0, done.stderr
