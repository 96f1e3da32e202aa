#!/usr/bin/env python3
"""decode_modes.py — few query rows against a long key sequence, the three ways attnrun can
run them, side by side in one run: one rank (all the host's threads), the ring and
split-KV over P ranks (one thread each, the same cores in all). Per problem: forward (and
--bwd backward) time of the slowest rank, bytes each rank sent, exposed communication,
and the ratios ring / split-KV. Each run appends its attnrun --json record to --json.

    python3 bench/scaling/decode_modes.py --ranks 2 --sq 8,64 --skv 32K,128K \\
        --json bench/results/DATE-decode-modes.jsonl [--heads 32 --kv-heads 8 --head-dim 128]

The ring needs a query row per chunk (zigzag: 2P), so Sq below that runs split-KV only.
Exit status: 0 when every run succeeded, 1 otherwise, 2 on bad arguments."""
import argparse
import json
import os
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def count(s):
    s = s.strip().upper()
    mult = {"K": 1024, "M": 1024 * 1024}.get(s[-1:], 1)
    return int(s[:-1] if mult > 1 else s) * mult


def run(args, ranks, mode, threads, sq, skv):
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    cmd = [args.attnrun, "--seq", str(sq), "--seq-kv", str(skv), "--heads", str(args.heads),
           "--kv-heads", str(args.kv_heads), "--head-dim", str(args.head_dim), "--causal",
           "--iters", str(args.iters), "--threads", str(threads), "--backend", "cpu",
           "--json", args.json, "--timeout", "120"]
    if args.bwd:
        cmd.append("--bwd")
    if ranks > 1:
        cmd = [args.mpiexec, "-n", str(ranks), "--oversubscribe", "--bind-to", "none",
               "--timeout", str(int(args.timeout))] + cmd + ["--mode", mode]
    before = open(args.json).read().count("\n") if os.path.exists(args.json) else 0
    try:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           timeout=args.timeout + 30, env=env)
        rc, out = p.returncode, p.stdout
    except subprocess.TimeoutExpired:
        rc, out = 124, ""
    lines = open(args.json).read().splitlines() if os.path.exists(args.json) else []
    if rc != 0 or len(lines) <= before:
        print(f"  FAILED (rc {rc}): {' '.join(cmd)}\n{out[-2000:]}", flush=True)
        return None
    return json.loads(lines[-1])


def cols(r, bwd):
    if r is None:
        return None
    pre = "bwd_" if bwd else ""
    ranks = r.get("per_rank") or [{}]
    sent = max(x.get(f"{'bwd' if bwd else 'fwd'}_sent_bytes", 0) or 0 for x in ranks)
    return r[f"{pre}time_s"] * 1e3, sent, 100 * (r.get(f"{pre}exposed_frac") or 0)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--sq", default="1,8,64", help="comma list of query rows")
    ap.add_argument("--skv", default="32K,128K", help="comma list of key rows (K/M suffixes)")
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--bwd", action="store_true")
    ap.add_argument("--json", required=True)
    ap.add_argument("--attnrun", default=os.path.join(ROOT, "build", "launch", "attnrun"))
    ap.add_argument("--mpiexec", default=shutil.which("mpiexec") or "mpiexec")
    ap.add_argument("--timeout", type=float, default=300)
    try:
        args = ap.parse_args(argv)
        sqs, skvs = [count(x) for x in args.sq.split(",")], [count(x) for x in args.skv.split(",")]
    except (SystemExit, ValueError) as e:
        print(f"decode_modes.py: bad arguments ({e})", file=sys.stderr)
        return 2
    P, failed = args.ranks, 0
    print(f"# decode_modes: P={P} ranks (1 thread each) vs 1 rank x {P} threads; "
          f"Hq={args.heads} Hkv={args.kv_heads} d={args.head_dim} causal; median of "
          f"{args.iters} iterations, the slowest rank; sent: bytes per rank per call")
    passes = ["fwd"] + (["bwd"] if args.bwd else [])
    print(f"{'Sq':>5} {'Skv':>8} {'pass':>4} | {'1 rank ms':>9} | {'ring ms':>8} {'sent KiB':>9} "
          f"{'exp%':>5} | {'split ms':>8} {'sent KiB':>9} {'exp%':>5} | {'ring/split':>10} "
          f"{'1rank/split':>11} {'bytes r/s':>9}")
    for skv in skvs:
        for sq in sqs:
            one = run(args, 1, "auto", P, sq, skv)
            ring = run(args, P, "ring", 1, sq, skv) if sq >= 2 * P else None
            split = run(args, P, "split-kv", 1, sq, skv)
            failed += (one is None) + (split is None) + (sq >= 2 * P and ring is None)
            for bwd, name in enumerate(passes):
                o, r, s = cols(one, bwd), cols(ring, bwd), cols(split, bwd)
                def f(x, i, fmt):
                    return format(x[i], fmt) if x else "-".rjust(len(format(0.0, fmt)))
                ratio = lambda a, b, i: f"{a[i] / b[i]:.2f}" if a and b and b[i] else "-"
                print(f"{sq:>5} {skv:>8} {name:>4} | {f(o, 0, '9.2f')} | {f(r, 0, '8.2f')} "
                      f"{(f'{r[1] / 1024:9.1f}' if r else '-'.rjust(9))} {f(r, 2, '5.1f')} | "
                      f"{f(s, 0, '8.2f')} {(f'{s[1] / 1024:9.1f}' if s else '-'.rjust(9))} "
                      f"{f(s, 2, '5.1f')} | {ratio(r, s, 0):>10} {ratio(o, s, 0):>11} "
                      f"{ratio(r, s, 1):>9}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
