#!/usr/bin/env python3
"""random_sweep.py — attnrun on random problems, each checked against the float64 oracle
(--check): shapes around the tiles and the row kernels (Sq 1..17, Skv past one key tile),
every head dim class, GQA/MQA, every mask flag and dtype, a KV cache (paged, random used
lengths), one rank and 2-4 ranks (ring, tp, split-kv, auto, layouts, the --d-model layer). A run fails when attnrun exits 1 (an error) or
3 (wrong elements), or outlives its timeout; exit 2 (a refused combination, e.g. heads
that tp does not divide) is counted, not failed. Each run prints its command, so a
failure reproduces as it stands; the seed picks the problems.
    random_sweep.py --attnrun PATH [--mpiexec PATH] [--seed N] [--count N] [--max-ranks P]
                    [--backend cpu|cuda] [--small] [--seconds S]
Exit status: 0 every run passed, 1 some failed, 2 bad arguments."""
import argparse
import os
import random
import subprocess
import sys
import time


def problem(rng, max_ranks, cuda, small):
    """(ranks, attnrun flags) of one random problem; cuda: the head dims the CUDA kernels
    take; small: sizes an emulated device runs in seconds."""
    hkv = rng.choice([1, 2, 3, 4])
    hq = hkv * rng.choice([1, 2, 3])
    if cuda:
        d, dv = rng.choice([(64, 64), (128, 128), (128, 128), (256, 256), (192, 128)])
    else:
        d = rng.choice([16, 32, 48, 64, 80, 96, 128, 256])
        dv = rng.choice([d, d, 32, 64, 128])
    sq = rng.choice([1, 2, 3, 4, 5, 6, 7, 9, 10, 13, 16, 17, 31, 63, 64, 65, 127, 128, 129, 200, 257, 513])
    skv = rng.choice([sq, sq, sq, 1, 5, 100, 128, 129, 300, 1024])
    batch = rng.choice([1, 1, 2, 3])
    if small:
        sq, skv, batch, hkv, hq = min(sq, 129), min(skv, 300), min(batch, 2), min(hkv, 2), min(hq, 4)
        hq -= hq % hkv
    f = ["--seq", str(sq), "--seq-kv", str(skv), "--heads", str(hq), "--kv-heads", str(hkv),
         "--head-dim", str(d), "--head-dim-v", str(dv),
         "--dtype", rng.choice(["bf16", "bf16", "f16", "f32"] if cuda else ["f32", "f32", "bf16", "f16"])]
    if rng.random() < 0.5:
        f.append("--causal")
    if rng.random() < 0.3:
        f += ["--window", f"{rng.choice([-1, 0, 3, 17, 100])},{rng.choice([-1, 0, 5, 64])}"]
    if rng.random() < 0.25:
        f += ["--softcap", "20"]
    for flag in ("--sinks", "--alibi"):
        if rng.random() < 0.25:
            f.append(flag)
    if rng.random() < 0.1:
        f += ["--scale", "0.3"]
    if rng.random() < 0.5:
        f.append("--bwd")
    if rng.random() < 0.1 and not cuda:
        f.append("--scalar")
    if rng.random() < 0.15 and sq == skv and sq >= 3:
        f += ["--varlen", str(rng.choice([2, 3]))]
        batch = 1
    elif rng.random() < 0.1:
        f += ["--sparse", rng.choice(["local=1,global=1,block=64", "local=2,stride=3,random=1,block=32"])]
    f += ["--batch", str(batch)]
    ranks = rng.choice([1, 1] + list(range(2, max_ranks + 1)))
    if ranks == 1 and "--varlen" not in f and rng.random() < 0.2:  # a KV cache: forward only
        if "--bwd" in f:
            f.remove("--bwd")
        if rng.random() < 0.7:
            f += ["--page-size", str(min(skv, rng.choice([1, 7, 16, 64, 128, 256])))]
        f += ["--cache-lens", "random"]
    if ranks > 1:
        mode = rng.choice(["ring", "tp", "split-kv", "auto"])
        if mode == "tp" and (hq % ranks or (hkv % ranks and ranks % hkv)) and rng.random() < 0.8:
            mode = "ring"  # mostly problems that run; some refusals stay, to test them
        f += ["--mode", mode]
        if rng.random() < 0.3:
            f += ["--layout", rng.choice(["zigzag", "contiguous"])]
        if rng.random() < 0.15 and sq == skv and mode != "split-kv":  # self-attention
            f += ["--d-model", str(hq * d)]
    return ranks, f


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--attnrun", required=True)
    ap.add_argument("--mpiexec", default="mpiexec")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--count", type=int, default=30)
    ap.add_argument("--max-ranks", type=int, default=4, help="0 or 1: one rank only")
    ap.add_argument("--timeout", type=float, default=240, help="seconds a run may take")
    ap.add_argument("--backend", default="cpu", help="cpu | cuda (a GPU, or the emulator's attnrun_emu_cli)")
    ap.add_argument("--small", action="store_true", help="sizes an emulated device runs in seconds")
    ap.add_argument("--seconds", type=float, default=0, help="start no run after this many seconds (0: no limit)")
    a = ap.parse_args(argv)
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    rng = random.Random(a.seed)
    counts = {"passed": 0, "refused": 0, "failed": 0}
    start, ran = time.time(), 0
    for i in range(a.count):
        if a.seconds and time.time() - start > a.seconds:
            break
        ran += 1
        ranks, f = problem(rng, max(a.max_ranks, 1), a.backend == "cuda", a.small)
        f += ["--check", "8", "--iters", "1", "--warmup", "0", "--backend", a.backend]
        if ranks > 1:
            cmd = [a.mpiexec, "-n", str(ranks), "--oversubscribe", "--bind-to", "none",
                   "--timeout", str(int(a.timeout)), a.attnrun] + f + ["--threads", "1", "--timeout", "60"]
        else:
            cmd = [a.attnrun] + f + ["--threads", str(rng.choice([1, 2, 3]))]
        t0 = time.time()
        try:
            p = subprocess.run(cmd, env=env, capture_output=True, text=True,
                               timeout=a.timeout + (30 if ranks > 1 else 0))
            rc, out = p.returncode, p.stdout + p.stderr
        except subprocess.TimeoutExpired as e:
            rc, out = "timeout", e.stdout if isinstance(e.stdout, str) else (e.stdout or b"").decode(errors="replace")
        verdict = "passed" if rc == 0 else "refused" if rc == 2 else "failed"
        counts[verdict] += 1
        print(f"[{i}] {verdict} (rc {rc}, {time.time() - t0:.1f} s): {' '.join(cmd)}", flush=True)
        if verdict == "refused":
            why = [l for l in out.splitlines() if l.startswith("attnrun")][:1]
            print(f"    {why[0] if why else out.strip()[-200:]}")
        elif verdict == "failed":
            print("\n".join("    " + l for l in out.strip().splitlines()[-30:]), flush=True)
    print(f"random_sweep seed {a.seed}: {counts['passed']} passed, {counts['refused']} refused "
          f"(exit 2), {counts['failed']} failed of {ran}" + (f" (of {a.count}: --seconds)" if ran < a.count else ""))
    return 1 if counts["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
