"""Compiles b2b's small C sources (gemv_shim.c, cpu_step.c; cpu_ops.py builds its extension
through `cached` too) with the system C compiler, once per source version and machine, into a
folder only this user can write. MLX's CPU backend needs a compiler at run time anyway;
without one (or when a build fails) callers keep their MLX path.

Imported before `mlx.core` (by way of gemv_shim): standard library only.
"""
from __future__ import annotations

import hashlib
import logging
import os
import platform
import shutil
import stat
import subprocess
import tempfile
from functools import lru_cache
from typing import Callable

log = logging.getLogger(__name__)


def _private_folder(folder: str) -> bool:
    """Create `folder` (mode 0700) if needed; True when it is ours and nobody else can write it
    (a shared /tmp folder someone else made could hold a planted library)."""
    try:
        os.makedirs(folder, mode=0o700, exist_ok=True)
        st = os.stat(folder)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


def _folders() -> list[str]:
    home = os.path.expanduser("~")  # stays "~" when there is no home directory
    cache = os.environ.get("XDG_CACHE_HOME") or (os.path.join(home, ".cache") if home != "~" else "")
    private_tmp = os.path.join(tempfile.gettempdir(), f"b2b-{os.getuid()}")
    return [os.path.join(cache, "b2b"), private_tmp] if cache else [private_tmp]


@lru_cache(maxsize=1)
def _cpu_flags() -> bytes:
    """The CPU's feature flags: a build with -march=native belongs to this kind of CPU only
    (a home folder shared between machines must not hand one's build to another). Read once."""
    try:
        with open("/proc/cpuinfo", "rb") as f:
            return next((line for line in f if line.startswith(b"flags")), b"")
    except OSError:
        return b""


def library_name(source: str, flags: tuple[str, ...], extra: tuple[str, ...] = ()) -> str:
    """The build's file name: one per source version (`source` and any `extra` files), compiler
    flags and machine type."""
    digest = hashlib.sha256()
    for path in (source, *extra):
        with open(path, "rb") as f:
            digest.update(f.read())
    digest.update(" ".join(flags).encode())
    if "-march=native" in flags:
        digest.update(_cpu_flags())
    stem = os.path.splitext(os.path.basename(source))[0]
    return f"{stem}-{digest.hexdigest()[:12]}-{platform.machine()}.so"


def cached(name: str, make: Callable[[str], None], retry: bool = False) -> str | None:
    """Path of the build `name` in the first private cache folder, made now by `make(path)` if
    it is not there yet (written to a temporary name, then renamed: a concurrent build of the
    same version writes the same file), or None when `make` fails. A failed compilation is
    remembered beside it (`name.failed`, holding the error) so that later processes do not
    retry a broken build at every start; `retry` (setup.sh's build) tries again. Missing tools
    (OSError) are not remembered: installing them is enough."""
    for folder in _folders():
        if not _private_folder(folder):
            continue
        out = os.path.join(folder, name)
        if os.path.exists(out):
            return out
        if os.path.exists(out + ".failed"):
            if not retry:
                return None
            os.remove(out + ".failed")
        fd, tmp = tempfile.mkstemp(prefix=name + ".", suffix=".tmp", dir=folder)
        os.close(fd)
        try:
            make(tmp)
            os.replace(tmp, out)
            return out
        except subprocess.SubprocessError as e:
            log.debug("Could not build %s: %s", name, e)
            with open(out + ".failed", "w") as f:
                f.write(f"{e}\n")
            return None  # a compiler that fails here fails in every folder
        except OSError as e:
            log.debug("Could not build %s: %s", name, e)
            return None
        finally:
            if os.path.exists(tmp):
                os.remove(tmp)
    return None


def build(source: str, flags: tuple[str, ...] = ("-O2",), headers: tuple[str, ...] = ()) -> str | None:
    """Path of the compiled C `source` (built now if this version has no build yet), or None;
    `headers`: the files it includes, part of its version."""
    def make(path: str) -> None:
        compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
        if not compiler:
            raise OSError("no C compiler")
        cmd = [compiler, *flags, "-shared", "-fPIC", source, "-o", path, "-lm"]
        subprocess.run(cmd, check=True, capture_output=True, timeout=60)

    return cached(library_name(source, flags, headers), make)
