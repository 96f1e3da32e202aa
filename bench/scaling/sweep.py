#!/usr/bin/env python3
"""sweep.py — a scaling study (DESIGN.md §7): runs attnrun over ranks x sequence x mode
under mpiexec, each run appending its JSON record (attnrun --json), plus one linkprobe.py
run for the link term; then calibrates the cost model on them (model.py) and prints the
model against every run. The JSON lines are the study's data: plot.py draws them.

    python3 bench/scaling/sweep.py --ranks 1,2,4 --seq 2K,8K --mode ring,tp \\
        --json bench/results/scaling-DATE.jsonl [--heads 8 --head-dim 64 --causal --bwd]

Ranks beyond the host's cores run oversubscribed (--oversubscribe), which the study's
header says. Every run has a timeout (--timeout, default 600 s, and mpiexec --timeout): a
run that fails or hangs is reported and the sweep goes on. Exit status: 0 when every run
succeeded; 1 otherwise; 2 on bad arguments."""
import argparse
import os
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import model  # noqa: E402


def run(cmd, timeout, env):
    t0 = time.time()
    try:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           timeout=timeout, env=env)
        return p.returncode, p.stdout, time.time() - t0
    except subprocess.TimeoutExpired as e:
        return 124, (e.stdout or "") if isinstance(e.stdout, str) else "", time.time() - t0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ranks", default="1,2", help="comma list of rank counts")
    ap.add_argument("--seq", default="2K,4K", help="comma list of sequence lengths (K/M suffixes)")
    ap.add_argument("--mode", default="ring,tp", help="comma list: ring, tp (1 rank runs plain attention)")
    ap.add_argument("--json", required=True, help="JSON lines to append to")
    ap.add_argument("--attnrun", default=os.path.join(ROOT, "build", "launch", "attnrun"))
    ap.add_argument("--mpiexec", default=shutil.which("mpiexec") or "mpiexec")
    ap.add_argument("--python", default=sys.executable, help="python with mpi4py, for linkprobe")
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--no-probe", action="store_true", help="skip linkprobe.py")
    ap.add_argument("--new", action="store_true", help="empty the --json file first")
    ap.add_argument("--max-err", type=float, default=1.0, help="model error that fails validate")
    ap.add_argument("problem", nargs=argparse.REMAINDER,
                    help="after --: attnrun problem flags (default --heads 8 --head-dim 64 --causal)")
    a = ap.parse_args(argv)
    try:
        ranks = [int(x) for x in a.ranks.split(",")]
        seqs = [model.sizes(x) for x in a.seq.split(",")]
    except ValueError as e:
        print(f"sweep.py: --ranks / --seq: {e}", file=sys.stderr)
        return 2
    modes = a.mode.split(",")
    if not os.access(a.attnrun, os.X_OK) or any(m not in ("ring", "tp") for m in modes):
        print(f"sweep.py: no attnrun at {a.attnrun} (build first), or --mode not ring/tp", file=sys.stderr)
        return 2
    if a.new:
        open(a.json, "w").close()
    problem = [x for x in a.problem if x != "--"] or ["--heads", "8", "--head-dim", "64", "--causal"]
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    mpi = [a.mpiexec, "--oversubscribe", "--bind-to", "none", "--timeout", str(int(a.timeout))]
    print(f"# sweep: ranks {ranks} x seq {seqs} x modes {modes}; {os.cpu_count()} cores here"
          f"{' (oversubscribed past that)' if max(ranks) > (os.cpu_count() or 1) else ''}; problem {' '.join(problem)}")
    failed = 0
    if not a.no_probe and max(ranks) >= 2:
        rc, out, dt = run(mpi + ["-n", "2", a.python, os.path.join(HERE, "linkprobe.py"), "--json", a.json],
                          a.timeout, env)
        print(f"linkprobe: rc {rc} in {dt:.1f} s: {out.strip().splitlines()[-1] if out.strip() else ''}")
        failed += rc != 0
    for n in ranks:
        for s in seqs:
            for m in (modes if n > 1 else ["single"]):
                cmd = ([a.attnrun] if n == 1 else mpi + ["-n", str(n), a.attnrun, "--mode", m])
                cmd += ["--seq", str(s), "--json", a.json] + problem
                rc, out, dt = run(cmd, a.timeout + 30, env)
                tail = [ln for ln in out.splitlines() if ln.strip().startswith(("forward", "backward"))]
                print(f"ranks {n:3d} seq {s:8d} {m:6s}: rc {rc} in {dt:6.1f} s  "
                      f"{tail[-1].split()[2] + ' ms' if tail else ''}")
                if rc != 0:
                    failed += 1
                    print("\n".join(out.splitlines()[-15:]))
    runs, probes = model.load([a.json])
    cal = model.calibrate(runs, probes)
    print(f"# calibration: rates (FLOP/s per thread or device) {cal['rates']}; link {cal['link']}")
    _, bad = model.validate(runs, cal, a.max_err)
    return 1 if failed or bad else 0


if __name__ == "__main__":
    sys.exit(main())
