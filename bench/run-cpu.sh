#!/usr/bin/env bash
# run-cpu.sh — builds bench_cpu if needed and runs it (2 threads unless --threads);
# arguments pass through, e.g. `bench/run-cpu.sh --quick` or `--json bench/results/x.jsonl`.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${BUILD_DIR:-$root/build}"
if [ ! -f "$build/CMakeCache.txt" ]; then
  cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release
fi
cmake --build "$build" -j2 --target bench_cpu
exec "$build/bench/bench_cpu" "$@"
