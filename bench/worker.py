"""A long-lived worker process for one side (b2b or hf): reads JSON commands on stdin, answers
one JSON line each on the original stdout. Only one side's framework is imported, so the
process's peak resident memory belongs to that side alone."""
from __future__ import annotations

import json
import os
import resource
import sys
import traceback


def peak_mb() -> dict:
    """This process's peak resident set since the last reset (VmHWM) and over its life (ru_maxrss)."""
    hwm = None
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                hwm = int(line.split()[1]) / 1024
    return {"row_peak_mb": hwm, "life_peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def reset_peak() -> None:
    """Start a new VmHWM window (Linux: writing 5 to clear_refs resets the peak RSS)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def main(side_name: str, inputs_path: str) -> int:
    out = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # library chatter goes to stderr; stdout carries only the protocol
    sys.stdout = sys.stderr
    import numpy as np

    if side_name == "b2b":
        from .side_b2b import Side
    else:
        from .side_hf import Side
    side = Side(dict(np.load(inputs_path)))
    out.write(json.dumps({"ok": True, "info": side.info, **peak_mb()}) + "\n")
    for line in sys.stdin:
        cmd = json.loads(line)
        op = cmd.pop("op")
        try:
            if op == "quit":
                break
            if op == "reset_peak":
                reset_peak()
                result = {}
            elif op == "peak":
                result = peak_mb()
            else:
                result = getattr(side, op)(**cmd) or {}
            out.write(json.dumps({"ok": True, **result}) + "\n")
        except Exception as e:  # noqa: BLE001 - the parent reports it and stops
            out.write(json.dumps({"ok": False, "error": f"{e.__class__.__name__}: {e}", "trace": traceback.format_exc()}) + "\n")
    return 0
