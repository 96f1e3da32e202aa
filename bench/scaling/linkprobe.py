#!/usr/bin/env python3
"""linkprobe.py — the link term of the cost model: MPI ping-pong between ranks 0 and 1
(mpi4py, the same Open MPI that attnrun uses) over message sizes 8 B .. 64 MiB; appends
one JSON line {"tool": "linkprobe", "where", "points": [{"bytes", "seconds"}]} (one-way
time: half the median round trip) that model.py fits alpha + bytes/beta to.
    mpiexec -n 2 python3 bench/scaling/linkprobe.py --json FILE [--max-mib 64] [--reps 20]
Exit status 0; 2 on bad arguments or fewer than 2 ranks; 77 without NumPy or mpi4py."""
import argparse
import json
import socket
import statistics
import sys
import time

try:
    import numpy as np
    from mpi4py import MPI
except ImportError as e:
    print(f"linkprobe: {e}, skipped")
    sys.exit(77)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", required=True)
    ap.add_argument("--max-mib", type=float, default=64)
    ap.add_argument("--reps", type=int, default=20)
    a = ap.parse_args()
    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    if comm.Get_size() < 2:
        print("linkprobe: needs 2 ranks (mpiexec -n 2)", file=sys.stderr)
        return 2
    hosts = comm.gather(socket.gethostname())
    sizes, n = [], 8
    while n <= a.max_mib * (1 << 20):
        sizes.append(n)
        n *= 4
    buf = np.zeros(sizes[-1], np.uint8)
    points = []
    for n in sizes:
        reps = max(3, a.reps if n < (1 << 20) else a.reps // 4)
        times = []
        for it in range(reps + 1):
            comm.Barrier()
            t0 = time.perf_counter()
            if rank == 0:
                comm.Send([buf[:n], MPI.BYTE], dest=1)
                comm.Recv([buf[:n], MPI.BYTE], source=1)
            elif rank == 1:
                comm.Recv([buf[:n], MPI.BYTE], source=0)
                comm.Send([buf[:n], MPI.BYTE], dest=0)
            if it:  # the first is a warm-up
                times.append(time.perf_counter() - t0)
        points.append({"bytes": n, "seconds": statistics.median(times) / 2})
    if rank == 0:
        rec = {"tool": "linkprobe", "where": "same host" if hosts[0] == hosts[1] else "two hosts",
               "hosts": hosts[:2], "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
               "points": points}
        with open(a.json, "a") as f:
            f.write(json.dumps(rec) + "\n")
        big = points[-1]
        print(f"linkprobe: {len(points)} sizes, {big['bytes'] / big['seconds'] / 1e9:.2f} GB/s at "
              f"{big['bytes'] >> 20} MiB, {points[0]['seconds'] * 1e6:.1f} us at 8 B ({rec['where']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
