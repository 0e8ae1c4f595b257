"""What each b2b optimization buys: the same b2b rows with one optimization switched off at a
time (through its environment switch), all variants interleaved step by step in their own
worker processes, so they see the same machine load.

    python -m bench.ablate [--quick] [--rows finetune,...] [--variants VOCAB,ADAMW] [--reps N] [--baseline DIR]

--baseline DIR adds the code in DIR (a folder holding older `b2b/` and `train/` packages, e.g.
a checkout of the commit before the optimizations) as the "before" row.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

import numpy as np

from .compare import REPO, Worker, machine

VARIANTS = {
    "all optimizations": {},
    # What Debian's OpenBLAS 0.3.21 picks by itself on a CPU newer than it (runtime.py overrides it).
    "OPENBLAS_CORETYPE=Prescott (generic kernels)": {"OPENBLAS_CORETYPE": "Prescott", "B2B_OPENBLAS_CORETYPE": "0"},
    "B2B_FAST_MATH=0 (MLX exp/erf/softmax)": {"B2B_FAST_MATH": "0"},
    "B2B_ATTN_CHUNK=inf (one score matrix)": {"B2B_ATTN_CHUNK": str(10**12)},
    "B2B_CPU_ATTENTION=0 (MLX attention ops)": {"B2B_CPU_ATTENTION": "0"},
    "B2B_CPU_LAYERNORM=0 (MLX LayerNorm ops)": {"B2B_CPU_LAYERNORM": "0"},
    "B2B_CPU_GELU=0 (compiled MLX GELU)": {"B2B_CPU_GELU": "0"},
    "B2B_CPU_DROPOUT=0 (MLX bernoulli dropout)": {"B2B_CPU_DROPOUT": "0"},
    "B2B_CPU_VOCAB_LOSS=0 (logits + MLX cross-entropy)": {"B2B_CPU_VOCAB_LOSS": "0"},
    "B2B_CPU_ADAMW=0 (MLX AdamW, MLX norm)": {"B2B_CPU_ADAMW": "0"},
    "B2B_CPU_SHARDS=1 (training: one stream)": {"B2B_CPU_SHARDS": "1"},
    "B2B_TUNE_MALLOC=0 (glibc defaults)": {"B2B_TUNE_MALLOC": "0"},
    "B2B_CPU_STEP_HALF=0 (C steps read float32)": {"B2B_CPU_STEP_HALF": "0"},
    "B2B_CPU_STEP=0 (compiled MLX decoding steps)": {"B2B_CPU_STEP": "0"},
    "B2B_COMPILE_DECODE=0 (eager decoding)": {"B2B_COMPILE_DECODE": "0"},
}


def _chosen(variants: str | None) -> dict[str, dict]:
    """VARIANTS whose name holds one of the comma-separated `variants` (all when None), always
    with "all optimizations" first."""
    keys = [k.strip().lower() for k in variants.split(",") if k.strip()] if variants else []
    return {name: env for i, (name, env) in enumerate(VARIANTS.items())
            if i == 0 or not keys or any(k in name.lower() for k in keys)}


def _workers(inputs: str, tmp: str, baseline: str | None, variants: str | None = None) -> dict[str, Worker]:
    out = {}
    for i, (name, env) in enumerate(_chosen(variants).items()):
        out[name] = Worker("b2b", inputs, os.path.join(tmp, f"v{i}.log"), env)
    if baseline:
        # A folder where `bench` is this one but `b2b`/`train` come from the baseline.
        root = os.path.join(tmp, "baseline")
        if not os.path.isdir(root):
            os.makedirs(root)
            os.symlink(os.path.join(REPO, "bench"), os.path.join(root, "bench"))
            for pkg in ("b2b", "train"):
                os.symlink(os.path.join(os.path.abspath(baseline), pkg), os.path.join(root, pkg))
        out["before (baseline code)"] = Worker("b2b", inputs, os.path.join(tmp, "base.log"), {}, cwd=root)
    return out


def _round_robin(workers: dict[str, Worker], reps: int, op: str, **kw) -> dict[str, list[dict]]:
    res: dict[str, list[dict]] = {n: [] for n in workers}
    names = list(workers)
    for r in range(reps):
        for n in names if r % 2 == 0 else names[::-1]:
            res[n].append(workers[n].call(op, **kw))
    return res


def run(args) -> dict:
    from b2b import Tokenizer

    from .prepare import Shapes, write_inputs, write_models

    tmp = tempfile.mkdtemp(prefix="b2b-ablate-")
    out: dict = {"machine": machine(), "rows": {}}
    try:
        inputs = os.path.join(tmp, "inputs.npz")
        write_inputs(inputs, Tokenizer.default(), Shapes())
        folders = write_models(tmp, ["minilm"] if "mlm" in args.rows else [])
        reps = args.reps or (2 if args.quick else 4)
        for row in args.rows.split(","):
            print(f"[{time.strftime('%H:%M:%S')}] {row} ...", file=sys.stderr, flush=True)
            workers = _workers(inputs, tmp, args.baseline, args.variants)
            try:
                if row in ("finetune", "mlm"):
                    folder = folders["minilm-s2s" if row == "finetune" else "minilm-mlm"]
                    for w in workers.values():
                        w.call("train_setup", task=row, folder=folder)
                    _round_robin(workers, 1, "train_step")
                    res = _round_robin(workers, reps, "train_step")
                    stat = {n: float(np.median([r["seconds"] for r in v])) for n, v in res.items()}
                    each = {n: [round(r["seconds"], 3) for r in v] for n, v in res.items()}
                    unit = "step s"
                else:
                    for w in workers.values():
                        w.call("gen_setup", folder=folders["minilm-s2s"])
                    beams = 4 if row == "beam4" else 1
                    _round_robin(workers, 1, "generate", rows=[0], beams=beams, max_new_tokens=4)
                    lat: dict[str, list[float]] = {n: [] for n in workers}
                    for i in range(args.reps or (2 if args.quick else 5)):
                        res = _round_robin(workers, 1, "generate", rows=[i], beams=beams, max_new_tokens=128)
                        for n, v in res.items():
                            lat[n].append(v[0]["seconds"])
                    stat = {n: float(np.median(v)) for n, v in lat.items()}
                    each = {n: [round(t, 3) for t in v] for n, v in lat.items()}
                    unit = "latency s"
                peak = {n: w.call("peak")["life_peak_mb"] for n, w in workers.items()}
                out["rows"][row] = {"unit": unit, "time": stat, "each": each, "peak_mb": peak}
                print(f"  {json.dumps(out['rows'][row])}", file=sys.stderr, flush=True)
            finally:
                for w in workers.values():
                    w.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    out["machine"]["loadavg_end"] = list(os.getloadavg())
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--rows", default="finetune,mlm,greedy,beam4")
    p.add_argument("--baseline", default=None, help="folder with the older b2b/ and train/ packages")
    p.add_argument("--variants", default=None,
                   help="comma list: only the variants whose name holds one of these (e.g. VOCAB,ADAMW)")
    p.add_argument("--reps", type=int, default=0, help="measured steps (or articles) per variant")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    res = run(args)
    m = res["machine"]
    print(f"b2b ablation on {m['cpu']} ({m['cores']} cores); load average {m['loadavg_start'][0]:.2f} -> {m['loadavg_end'][0]:.2f}")
    for row, r in res["rows"].items():
        ref = r["time"]["all optimizations"]
        print(f"\n{row} ({r['unit']}, peak RSS MB)")
        for name, t in r["time"].items():
            print(f"  {name:<42}{t:8.2f}  x{t / ref:5.2f}  {r['peak_mb'][name]:7.0f} MB")
    path = args.json or os.path.join(REPO, "bench", "results", f"ablate{'-quick' if args.quick else ''}.json")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
