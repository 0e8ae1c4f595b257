#!/usr/bin/env bash
# Set up b2b in ./.venv:  bash setup.sh          (the app)
#                         bash setup.sh --test   (the app + test tools)
#                         bash setup.sh --cuda   (Linux + NVIDIA GPU: MLX's CUDA build, CUDA 12 as mlx[cuda];
#                                                 --cuda13 for drivers >= 580)
# On Linux it also installs a fast BLAS for MLX's CPU backend (OpenBLAS from the system's
# packages, or the `mkl` wheel when no package manager can be used); macOS needs nothing.
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3}
want_tests=0
cuda=""
for arg in "$@"; do
  case "$arg" in
    --test) want_tests=1 ;;
    --cuda|--cuda12) cuda=cuda12 ;;  # as MLX's own mlx[cuda]: runs on any driver for CUDA 12 or later
    --cuda13) cuda=cuda13 ;;
    *) echo "Unknown option $arg (use --test, --cuda or --cuda13)" >&2; exit 2 ;;
  esac
done
if [[ -n "$cuda" && "$(uname -s)" != "Linux" ]]; then
  echo "--cuda is for Linux with an NVIDIA GPU (macOS uses Metal): drop it." >&2
  exit 2
fi

if [[ "$(uname -s)" == "Linux" ]]; then
  # (ls of both paths would fail when either is missing: test each)
  if ! compgen -G "/usr/lib/*-linux-gnu/libopenblas.so.0" >/dev/null && [[ ! -e /usr/lib64/libopenblas.so.0 ]]; then
    as_root=""
    [[ "$(id -u)" != "0" ]] && command -v sudo >/dev/null && as_root="sudo"
    if command -v apt-get >/dev/null && { [[ "$(id -u)" == "0" ]] || [[ -n "$as_root" ]]; }; then
      echo "==> Installing OpenBLAS (MLX's CPU matmuls are ~40x faster with it)"
      $as_root apt-get update -qq && $as_root apt-get install -y -qq libopenblas0-pthread >/dev/null
    else
      echo "==> No apt-get/sudo: the mkl wheel will provide the fast BLAS instead"
      EXTRA_BLAS=mkl
    fi
  fi
fi

if [[ ! -x .venv/bin/python ]]; then
  echo "==> Creating .venv with $($PY --version)"
  if ! $PY -m venv .venv 2>/dev/null; then
    # Debian/Ubuntu ship venv's pip bootstrap separately (python3-venv / python3.X-venv).
    rm -rf .venv
    ver=$($PY -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
    as_root=""
    [[ "$(id -u)" != "0" ]] && command -v sudo >/dev/null && as_root="sudo"
    if command -v apt-get >/dev/null && { [[ "$(id -u)" == "0" ]] || [[ -n "$as_root" ]]; }; then
      echo "==> Installing python$ver-venv (needed to create the virtual environment)"
      $as_root apt-get update -qq && { $as_root apt-get install -y -qq "python$ver-venv" >/dev/null \
        || $as_root apt-get install -y -qq python3-venv >/dev/null; }
      $PY -m venv .venv
    else
      echo "Could not create a virtual environment: install your distribution's python$ver-venv package and rerun." >&2
      exit 1
    fi
  fi
fi
.venv/bin/python -m pip install -q --upgrade pip
echo "==> Installing requirements"
.venv/bin/python -m pip install -q -r requirements.txt ${EXTRA_BLAS:-}
if [[ $want_tests == 1 ]]; then
  .venv/bin/python -m pip install -q -r requirements-test.txt
fi
if [[ -n "$cuda" ]]; then
  # mlx-cpu and mlx-cuda-* both install mlx/lib/libmlx.so: remove the CPU build first.
  echo "==> Installing MLX's CUDA build (mlx[$cuda]) in place of the CPU one"
  mlx_version=$(.venv/bin/python -c "import importlib.metadata as m; print(m.version('mlx'))")
  .venv/bin/python -m pip uninstall -q -y mlx-cpu
  .venv/bin/python -m pip install -q "mlx[$cuda]==$mlx_version"
  # (again on a rerun: requirements.txt has just put mlx-cpu's libmlx.so over the CUDA one)
  .venv/bin/python -m pip install -q --force-reinstall --no-deps "mlx-${cuda/cuda/cuda-}==$mlx_version"
fi
if [[ "$(uname -s)" == "Linux" ]]; then
  # b2b's CPU kernels (an MLX extension) need CMake >= 3.24: the system's, or the wheel's.
  have=$(cmake --version 2>/dev/null | head -1 | awk '{print $3}')
  if [[ -z "$have" || "$(printf '%s\n3.24\n' "$have" | sort -V | head -1)" != "3.24" ]]; then
    .venv/bin/python -m pip install -q "cmake>=3.24" || echo "==> No CMake: MLX's own attention will be used"
  fi
  echo "==> Building b2b's CPU kernels (attention, LayerNorm, GELU, dropout, vocabulary loss, AdamW; once per MLX version, ~30 s)"
  .venv/bin/python -c "from b2b.cpu_ops import main; main()" || true
fi
.venv/bin/python -c "import b2b, json; print('==> b2b ready:', json.dumps(b2b.runtime_info()))"
