#!/usr/bin/env python3
"""kv_cache.py — what a KV cache costs the forward: attnrun with used lengths
(seqused_kv) on contiguous K/V, and on shuffled pages of several sizes (a block table), side by side
in interleaved rounds (the host is shared and noisy: compare ratios within one run).
Every run is checked against the float64 oracle (--check) and must report 0 wrong.

    python3 bench/kv_cache.py --attnrun build-cpu/launch/attnrun [--sq 1,16] [--skv 32K]
        [--batch 4] [--dtypes f32,bf16] [--pages 16,64,128,256] [--rounds 3] [--json F]

Prints one table row per (dtype, Sq, variant): the median over rounds of each run's median
time, and its ratio to the contiguous run (the same used lengths) of the same round."""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile


def size(s):
    s = s.strip().upper()
    mult = {"K": 1 << 10, "M": 1 << 20}.get(s[-1:], 1)
    return int(s[:-1] if mult > 1 else s) * mult


def run(exe, args, json_path):
    cmd = [exe] + args + ["--json", json_path]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if out.returncode != 0 or "OK: 0 wrong elements" not in out.stdout:
        sys.exit(f"kv_cache.py: {' '.join(cmd)} failed ({out.returncode}):\n{out.stdout}{out.stderr}")
    with open(json_path) as f:
        rec = json.loads(f.readlines()[-1])
    return rec


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--attnrun", required=True)
    ap.add_argument("--sq", default="1,16")
    ap.add_argument("--skv", default="32K")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--heads", default="32/8", help="Hq/Hkv")
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--dtypes", default="f32,bf16")
    ap.add_argument("--pages", default="16,64,128,256")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--iters", type=int, default=7)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", help="append every run's record here")
    a = ap.parse_args()
    hq, hkv = a.heads.split("/")
    # the baseline: contiguous K/V with the same used lengths; pages only change where rows lie
    variants = [("contiguous", ["--cache-lens", "random"])]
    variants += [(f"page {p}", ["--page-size", p, "--cache-lens", "random"]) for p in a.pages.split(",")]
    tmp = tempfile.mkdtemp(prefix="kv_cache_")
    print(f"# kv_cache.py: B={a.batch} Hq={hq} Hkv={hkv} d={a.head_dim} causal, {a.threads} threads, "
          f"{a.rounds} rounds interleaved; each batch's used keys random (--cache-lens random, "
          f"the same in every variant); ratio: time / the contiguous run's of the same round")
    for dt in a.dtypes.split(","):
        for sq in a.sq.split(","):
            for skv in a.skv.split(","):
                base = ["--seq", sq, "--seq-kv", skv, "--batch", str(a.batch), "--heads", hq,
                        "--kv-heads", hkv, "--head-dim", str(a.head_dim), "--causal", "--dtype", dt,
                        "--iters", str(a.iters), "--warmup", "1", "--threads", str(a.threads),
                        "--check", "8", "--backend", "cpu"]
                times = {n: [] for n, _ in variants}
                ratio = {n: [] for n, _ in variants}
                keys = 0
                for _ in range(a.rounds):
                    t_round = {}
                    for name, extra in variants:
                        rec = run(a.attnrun, base + extra, os.path.join(tmp, "run.jsonl"))
                        rec["kv_variant"] = name
                        if a.json:
                            with open(a.json, "a") as f:
                                f.write(json.dumps(rec) + "\n")
                        t_round[name] = rec["time_s"]
                        keys = rec["config"]["cache_keys"]
                    for name, _ in variants:
                        times[name].append(t_round[name])
                        ratio[name].append(t_round[name] / t_round["contiguous"])
                for name, _ in variants:
                    med, rs = statistics.median(times[name]), ratio[name]
                    print(f"{dt:5s} Sq={sq:>3s} Skv={skv:>5s} keys={keys:>7d} {name:11s} "
                          f"{med * 1e3:9.3f} ms  x{statistics.median(rs):.3f} "
                          f"(rounds {min(rs):.3f}..{max(rs):.3f})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
