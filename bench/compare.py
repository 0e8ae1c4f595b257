"""b2b against Hugging Face transformers (PyTorch), side by side, same architecture, same weights.

    python -m bench.compare            # the full table (~15-25 min on a 2-core CPU)
    python -m bench.compare --quick    # fewer repeats and articles (< 5 min)

Each side runs in its own long-lived worker process (`--worker b2b|hf`), so peak memory is
measured per side; the parent alternates the two step by step (b2b, HF, HF, b2b, ...) so both
see the same machine load. Prints a table, writes it as JSON, and prints one JSON object with
the headline ratios (b2b / HF) as its last line.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict

import numpy as np

from . import flops

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class BenchError(RuntimeError):
    """A worker failed; the message carries its traceback."""


class Worker:
    """One side in a subprocess, driven by JSON lines."""

    def __init__(self, side: str, inputs: str, log_path: str, env: dict | None = None, cwd: str = REPO):
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "TRANSFORMERS_VERBOSITY": "error",
               **(env or {})}
        self.side, self.log_path = side, log_path
        self._log = open(log_path, "w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bench.compare", "--worker", side, "--inputs", inputs],
            cwd=cwd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log, text=True, bufsize=1,
        )
        self.hello = self._read()

    def _read(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            self._log.flush()
            with open(self.log_path) as f:
                tail = f.read()[-3000:]
            raise BenchError(f"{self.side} worker exited:\n{tail}")
        reply = json.loads(line)
        if not reply.pop("ok"):
            raise BenchError(f"{self.side} worker: {reply['error']}\n{reply['trace']}")
        return reply

    def call(self, op: str, **kw) -> dict:
        try:
            self.proc.stdin.write(json.dumps({"op": op, **kw}) + "\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            pass  # the worker is gone: _read reports its log
        return self._read()

    def close(self) -> None:
        if self.proc.poll() is None and not self.proc.stdin.closed:
            try:
                self.proc.stdin.write(json.dumps({"op": "quit"}) + "\n")
                self.proc.stdin.flush()
                self.proc.stdin.close()
                self.proc.wait(timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
        self._log.close()


class Bench:
    def __init__(self, workers: dict[str, Worker], pause: float, train_block: int = 1):
        self.w, self.pause, self.train_block = workers, pause, max(1, train_block)
        self.sides = list(workers)

    def alternate(self, reps: int, op: str, block: int = 1, **kw) -> dict[str, list[dict]]:
        """`reps` calls of `op` on each side, alternating which side goes first, in turns of
        `block` consecutive calls (the last turn shorter when `block` does not divide `reps`)."""
        out: dict[str, list[dict]] = {s: [] for s in self.sides}
        for r, start in enumerate(range(0, reps, block)):
            for side in self.sides if r % 2 == 0 else self.sides[::-1]:
                for _ in range(min(block, reps - start)):
                    out[side].append(self.w[side].call(op, **kw))
                time.sleep(self.pause)  # let the other side's BLAS threads go idle
        return out

    def both(self, op: str, **kw) -> dict[str, dict]:
        return {s: self.w[s].call(op, **kw) for s in self.sides}

    def close(self) -> None:
        for w in self.w.values():
            w.close()


def _median(xs: list[float]) -> float:
    return float(np.median(xs))


def _p90(xs: list[float]) -> float:
    return float(np.percentile(xs, 90))


def matmul_row(bench: Bench, repeats: int) -> dict:
    shapes = [(4096, 384, 1536), (1024, 1024, 1024)]
    best = {s: 0.0 for s in bench.sides}
    for m, k, n in shapes:
        res = bench.alternate(1, "matmul", m=m, k=k, n=n, repeats=repeats)
        for s in bench.sides:
            best[s] = max(best[s], res[s][0]["gflops"])
    return best


def train_row(bench: Bench, task: str, folder: str, warmup: int, repeats: int, tokens: int, model_flops: int, peak: dict) -> dict:
    setup = bench.both("train_setup", task=task, folder=folder)
    bench.alternate(warmup, "train_step")  # compile / first-touch
    steps = bench.alternate(repeats, "train_step", block=bench.train_block)
    row = {"setup": setup, "tokens_per_step": tokens, "model_flops_per_step": model_flops}
    for s in bench.sides:
        secs = [r["seconds"] for r in steps[s]]
        t = _median(secs)
        row[s] = {
            "step_s": t, "steps_s": secs, "tokens_per_s": tokens / t, "model_tflops": model_flops / t / 1e12,
            "mfu": model_flops / t / (peak[s] * 1e9),
            "losses": [r["loss"] for r in steps[s]], "eval_loss": setup[s]["eval_loss"],
        }
    row["ratio"] = row["b2b"]["tokens_per_s"] / row["hf"]["tokens_per_s"]
    return row


def generation_rows(bench: Bench, folder: str, greedy_n: int, beam_n: int, batch: int, batched_n: int, max_new: int,
                    deadline: float | None = None) -> dict:
    """Per-article greedy and beam-4 latency, then batched greedy throughput. With a deadline
    (--quick), each loop stops early once the next article would not fit (at least one
    article each), and the batched row is skipped when one batch would not fit."""
    bench.both("gen_setup", folder=folder)
    bench.alternate(1, "generate", rows=[0], beams=1, max_new_tokens=4)  # warm-up
    bench.alternate(1, "generate", rows=[0], beams=4, max_new_tokens=4)
    out: dict = {}
    left = lambda: float("inf") if deadline is None else deadline - time.perf_counter()  # noqa: E731
    for name, beams, n, share in (("greedy", 1, greedy_n, 0.5), ("beam4", 4, beam_n, 1.0)):
        lat = {s: [] for s in bench.sides}
        toks = {s: [] for s in bench.sides}
        for i in range(n):
            if i and sum(lat[s][-1] for s in bench.sides) > share * left():
                break
            res = bench.alternate(1, "generate", rows=[i], beams=beams, max_new_tokens=max_new)
            for s in bench.sides:
                lat[s].append(res[s][0]["seconds"])
                toks[s].append(res[s][0]["tokens"][0])
        same = [a == b for a, b in zip(toks["b2b"], toks["hf"])]
        prefix = [_common_prefix(a, b) / max(len(a), len(b), 1) for a, b in zip(toks["b2b"], toks["hf"])]
        out[name] = {
            "articles": len(same), "agreement": float(np.mean(same)), "mean_common_prefix": float(np.mean(prefix)),
            **{s: {"median_s": _median(lat[s]), "p90_s": _p90(lat[s]), "latencies_s": lat[s],
                   "mean_new_tokens": float(np.mean([len(t) for t in toks[s]]))} for s in bench.sides},
        }
        out[name]["ratio"] = out[name]["b2b"]["median_s"] / out[name]["hf"]["median_s"]
    # One batch costs at most `batch` single-article latencies; skip it when that cannot fit.
    if batch * sum(out["greedy"][s]["median_s"] for s in bench.sides) > left():
        out["batched"] = None
        return out
    rows = list(range(batched_n))
    secs = {s: 0.0 for s in bench.sides}
    for start in range(0, batched_n, batch):
        res = bench.alternate(1, "generate", rows=rows[start : start + batch], beams=1, max_new_tokens=max_new)
        for s in bench.sides:
            secs[s] += res[s][0]["seconds"]
    out["batched"] = {"articles": batched_n, "batch": batch, **{s: {"articles_per_s": batched_n / secs[s]} for s in bench.sides}}
    out["batched"]["ratio"] = out["batched"]["b2b"]["articles_per_s"] / out["batched"]["hf"]["articles_per_s"]
    return out


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def machine() -> dict:
    model = "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {"cpu": model, "cores": os.cpu_count(), "platform": f"{platform.system()} {platform.machine()}",
            "python": platform.python_version(), "loadavg_start": list(os.getloadavg())}


def format_table(res: dict) -> str:
    lines = [f"{'row':<46}{'b2b':>14}{'HF':>14}{'b2b/HF':>9}", "-" * 83]

    def add(name, a, b, fmt="{:.1f}", ratio=None):
        r = ratio if ratio is not None else (a / b if b else float("nan"))
        lines.append(f"{name:<46}{fmt.format(a):>14}{fmt.format(b):>14}{r:>9.2f}")

    mm = res.get("matmul_gflops")
    if mm:
        add("matmul peak GFLOP/s (best of 2 shapes)", mm["b2b"], mm["hf"])
    for key, label in (("mlm_seed", "MLM train seed (B32 x S128), tokens/s"), ("mlm_minilm", "MLM train minilm (B32 x S128), tokens/s"),
                       ("finetune_minilm", "fine-tune minilm (B8, src<=512, tgt<=128), tok/s")):
        row = res.get(key)
        if not row:
            continue
        add(label, row["b2b"]["tokens_per_s"], row["hf"]["tokens_per_s"])
        add("  step time s (median)", row["b2b"]["step_s"], row["hf"]["step_s"], "{:.2f}")
        add("  MFU % (model FLOPs/s / own matmul peak)", 100 * row["b2b"]["mfu"], 100 * row["hf"]["mfu"])
        add("  eval-mode loss on the batch (same weights)", row["b2b"]["eval_loss"], row["hf"]["eval_loss"], "{:.4f}")
    gen = res.get("generation")
    if gen:
        for name in ("greedy", "beam4"):
            g = gen[name]
            add(f"{name} latency/article s, median ({g['articles']} art.)", g["b2b"]["median_s"], g["hf"]["median_s"], "{:.2f}")
            add(f"{name} latency/article s, p90", g["b2b"]["p90_s"], g["hf"]["p90_s"], "{:.2f}")
            add(f"{name} mean new tokens", g["b2b"]["mean_new_tokens"], g["hf"]["mean_new_tokens"], "{:.1f}")
            lines.append(f"{'  ' + name + ' identical outputs (same weights)':<46}{g['agreement'] * 100:>13.0f}%"
                         f"{'':>14}   prefix {g['mean_common_prefix'] * 100:.0f}%")
        b = gen["batched"]
        if b:
            add(f"greedy batch {b['batch']} throughput, articles/s", b["b2b"]["articles_per_s"], b["hf"]["articles_per_s"], "{:.2f}")
        else:
            lines.append("greedy batch throughput: skipped (--quick time budget)")
    mem = res.get("peak_rss_mb")
    if mem:
        for key, label in (("mlm_seed", "peak RSS MB, MLM seed"), ("mlm_minilm", "peak RSS MB, MLM minilm"),
                           ("finetune_minilm", "peak RSS MB, fine-tune"), ("generation", "peak RSS MB, generation")):
            if key in mem["rows"]:
                add(label, mem["rows"][key]["b2b"], mem["rows"][key]["hf"], "{:.0f}")
    return "\n".join(lines)


def run(args) -> dict:
    from .prepare import Shapes, write_inputs, write_models  # imports b2b (mlx) in the parent only
    from b2b import Tokenizer

    shapes = Shapes()
    quick = args.quick
    # Two fine-tuning warm-up steps: the first steps also grow the heap (runtime.tune_malloc).
    reps = dict(mlm_warmup=1, mlm=2 if quick else 7, ft_warmup=2, ft=5 if quick else 9,
                greedy=3 if quick else shapes.gen_articles, beam=2 if quick else shapes.gen_articles,
                batched=shapes.gen_batch if quick else shapes.gen_articles)
    rows = set(args.rows.split(","))
    tmp = tempfile.mkdtemp(prefix="b2b-bench-")
    res: dict = {"machine": machine(), "quick": quick, "shapes": asdict(shapes), "repeats": reps, "train_block": args.train_block}
    t0 = time.perf_counter()
    mem_rows: dict = {}
    alive: list[Bench] = []
    try:
        tok = Tokenizer.default()
        inputs = os.path.join(tmp, "inputs.npz")
        write_inputs(inputs, tok, shapes)
        presets = [p for p in ("seed", "minilm") if "mlm" in rows or f"mlm_{p}" in rows]
        folders = write_models(tmp, presets, half_values=not args.fp32_weights)
        res["s2s_weights"] = "float32 (MiniLM's)" if args.fp32_weights else "float16 values (as the shipped checkpoint), computed in float32"
        x = np.load(inputs)

        def fresh_pair() -> Bench:
            """Both workers, started anew for each row: a row's peak memory is its own."""
            env = {"b2b": {}, "hf": {"B2B_BENCH_TORCH_THREADS": str(args.torch_threads)}}
            workers = {side: Worker(side, inputs, os.path.join(tmp, f"{side}.log"), env[side]) for side in ("b2b", "hf")}
            res.setdefault("frameworks", {s: w.hello["info"] for s, w in workers.items()})
            alive.append(Bench(workers, args.pause, args.train_block))
            return alive[-1]

        def finish(bench: Bench, key: str) -> None:
            peak = bench.both("peak")
            mem_rows[key] = {s: peak[s]["life_peak_mb"] for s in bench.sides}
            bench.close()

        _progress("matmul peak", t0)
        bench = fresh_pair()
        res["matmul_gflops"] = peak = matmul_row(bench, 3 if quick else 5)
        bench.close()
        for preset in presets:
            cfg = json.load(open(os.path.join(folders[f"{preset}-mlm"], "config.json")))
            _progress(f"MLM {preset}", t0)
            scored = int(x["mlm_weights"].sum())
            f = flops.mlm_step(shapes.mlm_batch, shapes.mlm_seq, scored, cfg["hidden_size"], cfg["ffn_size"],
                               cfg["encoder_layers"], cfg["vocab_size"])
            key = f"mlm_{preset}"
            bench = fresh_pair()
            res[key] = train_row(bench, "mlm", folders[f"{preset}-mlm"], reps["mlm_warmup"], reps["mlm"],
                                 int(x["mlm_mask"].sum()), f, peak)
            finish(bench, key)
        cfg = json.load(open(os.path.join(folders["minilm-s2s"], "config.json")))
        if "finetune" in rows:
            _progress("fine-tune minilm", t0)
            tgt = x["ft_tgt"]
            src_b, src_t = x["ft_src"].shape
            f = flops.seq2seq_step(src_b, src_t, tgt.shape[1] - 1, int((tgt[:, 1:] != 0).sum()), cfg["hidden_size"],
                                   cfg["ffn_size"], cfg["encoder_layers"], cfg["decoder_layers"], cfg["vocab_size"])
            tokens = int(x["ft_mask"].sum() + (tgt != 0).sum())
            bench = fresh_pair()
            res["finetune_minilm"] = train_row(bench, "finetune", folders["minilm-s2s"], reps["ft_warmup"], reps["ft"], tokens, f, peak)
            res["finetune_minilm"]["shapes"] = {"source": list(x["ft_src"].shape), "target": list(tgt[:, :-1].shape)}
            finish(bench, "finetune_minilm")
        if "generate" in rows:
            _progress("generation", t0)
            bench = fresh_pair()
            res["generation"] = generation_rows(bench, folders["minilm-s2s"], reps["greedy"], reps["beam"], shapes.gen_batch,
                                                reps["batched"], shapes.max_new_tokens,
                                                deadline=t0 + args.budget if quick else None)
            finish(bench, "generation")
    finally:
        for b in alive:
            b.close()
        shutil.rmtree(tmp, ignore_errors=True)
    worst = max(mem_rows, key=lambda k: mem_rows[k]["b2b"] / mem_rows[k]["hf"]) if mem_rows else None
    res["peak_rss_mb"] = {"rows": mem_rows, "worst_row": worst}
    res["machine"]["loadavg_end"] = list(os.getloadavg())
    res["wall_s"] = time.perf_counter() - t0
    return res


def _progress(what: str, t0: float) -> None:
    print(f"[{time.perf_counter() - t0:6.0f} s] {what} ...", file=sys.stderr, flush=True)


def headline(res: dict) -> dict:
    def get(*path):
        node = res
        for p in path:
            if node is None or p not in node:
                return None
            node = node[p]
        return None if node is None else round(float(node), 3)

    mlm = [get(k, "ratio") for k in ("mlm_seed", "mlm_minilm") if k in res]
    mem = res.get("peak_rss_mb")
    worst = mem and mem["worst_row"]
    return {
        "mlm_train_ratio": round(min(mlm), 3) if mlm else None,
        "finetune_train_ratio": get("finetune_minilm", "ratio"),
        "greedy_latency_ratio": get("generation", "greedy", "ratio"),
        "beam4_latency_ratio": get("generation", "beam4", "ratio"),
        # the worst row: "no higher" must hold for every workload
        "peak_rss_ratio": round(mem["rows"][worst]["b2b"] / mem["rows"][worst]["hf"], 3) if worst else None,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="fewer repeats and articles: finishes within 5 minutes")
    p.add_argument("--rows", default="mlm,finetune,generate", help="comma list of mlm, finetune, generate")
    p.add_argument("--json", default=None, help="where to write the full results (default bench/results/compare[-quick].json)")
    p.add_argument("--fp32-weights", action="store_true",
                   help="keep MiniLM's float32 values in the fine-tune/generation model (default: rounded to float16 "
                        "values, as a checkpoint exported in float16 loads; both sides get the same tensors)")
    p.add_argument("--pause", type=float, default=0.1, help="seconds between the two sides' calls")
    p.add_argument("--train-block", type=int, default=1,
                   help="training steps each side runs back to back before the other's turn (default 1: strictly "
                        "alternating; a training loop runs its steps back to back)")
    p.add_argument("--torch-threads", type=int, default=2, help="torch.set_num_threads for the HF side (default 2: the cores)")
    p.add_argument("--budget", type=float, default=285.0, help="--quick: seconds the whole run aims to fit in")
    p.add_argument("--worker", choices=("b2b", "hf"), help=argparse.SUPPRESS)
    p.add_argument("--inputs", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        from .worker import main as worker_main

        return worker_main(args.worker, args.inputs)
    res = run(args)
    res["headline"] = head = headline(res)
    m = res["machine"]
    print(f"b2b vs Hugging Face on {m['cpu']} ({m['cores']} cores, {m['platform']}); load average "
          f"{m['loadavg_start'][0]:.2f} at start, {m['loadavg_end'][0]:.2f} at end; {res['wall_s']:.0f} s"
          f"{' (--quick)' if res['quick'] else ''}")
    print(f"b2b: {res['frameworks']['b2b']}; HF: {res['frameworks']['hf']}")
    print(f"fine-tune/generation model weights: {res['s2s_weights']}")
    print(format_table(res))
    path = args.json or os.path.join(REPO, "bench", "results", f"compare{'-quick' if args.quick else ''}.json")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(res, f, indent=1)
    print(f"full results: {os.path.relpath(path)}")
    print(json.dumps(head))
    return 0


if __name__ == "__main__":
    sys.exit(main())
