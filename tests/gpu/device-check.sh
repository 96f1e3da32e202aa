#!/usr/bin/env bash
# tests/gpu/device-check.sh — the one script a GPU session runs (budget: under 8 minutes):
# device info, build (the full project with -DATTN_CUDA=ON, else the CUDA part alone from
# tests/gpu/standalone), the ptxas spill check, every CUDA test (ctest -L gpu),
# compute-sanitizer memcheck and racecheck on small shapes, and the benchmark side by side
# with PyTorch SDPA (flash, cuDNN). Every stage is timed and `timeout`-wrapped; a failing
# stage is recorded and the script goes on. Ends with a summary table.
#
# Writes to $OUT when set (device-check.log, summary.md, bench-<date>-<card>.jsonl / .md),
# else to bench/results/. Environment: ATTN_CHECK_BUDGET_S (default 450: no stage starts
# after that), ATTN_CHECK_JOBS (default 16), ATTN_CHECK_ARCH (default: the device's, e.g. 90a).
set -u -o pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT" || exit 1
START=$(date +%s)
BUDGET=${ATTN_CHECK_BUDGET_S:-450}
JOBS=${ATTN_CHECK_JOBS:-16}
DATE=$(date -u +%Y-%m-%d)
DEST=${OUT:-$ROOT/bench/results}
mkdir -p "$DEST"
LOG="$DEST/device-check.log"
: >"$LOG"
S_NAME=() S_RES=() S_SEC=() S_NOTE=()

note() { echo "$*" | tee -a "$LOG"; }

# stage NAME LIMIT_S COMMAND... — runs COMMAND (appending to the log) under timeout.
stage() {
  local name=$1 limit=$2 left rc t0 t1 res
  shift 2
  left=$((BUDGET - ($(date +%s) - START)))
  if ((left < 15)); then
    S_NAME+=("$name") S_RES+=("skipped") S_SEC+=("0") S_NOTE+=("out of time budget")
    STAGE_NOTE=""
    note "==== $name: skipped (budget spent)"
    return 99
  fi
  ((limit > left)) && limit=$left
  note "==== $name (limit ${limit}s): $*"
  t0=$(date +%s%N)
  timeout -k 10 "$limit" "$@" >>"$LOG" 2>&1
  rc=$?
  t1=$(date +%s%N)
  case $rc in
    0) res=ok ;;
    124 | 137) res="TIMEOUT" ;;
    77) res=skipped ;;
    *) res="FAIL ($rc)" ;;
  esac
  S_NAME+=("$name") S_RES+=("$res") S_SEC+=("$(((t1 - t0) / 1000000000))") S_NOTE+=("${STAGE_NOTE:-}")
  STAGE_NOTE=""
  note "---- $name: $res"
  return $rc
}

# ---- 0. the device ------------------------------------------------------------------------
CARD=unknown-gpu
if command -v nvidia-smi >/dev/null; then
  nvidia-smi -L | tee -a "$LOG"
  CARD=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 | tr ' ' '-' | tr -cd 'A-Za-z0-9-')
fi
[ -n "$CARD" ] || CARD=unknown-gpu
CC=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d '. ')
case "$CC" in 90) ARCH=90a ;; [0-9][0-9]) ARCH=$CC ;; *) ARCH="80;90a" ;; esac
ARCH=${ATTN_CHECK_ARCH:-$ARCH}
info() {
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm,clocks.mem,power.limit --format=csv
  nvcc --version | tail -2
  cmake --version | head -1
  command -v compute-sanitizer || echo "compute-sanitizer: not on PATH"
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name(0))'
  git -C "$ROOT" rev-parse --short=12 HEAD 2>/dev/null || echo "git: no repository"
}
STAGE_NOTE="$CARD, sm_$CC, building for $ARCH"
stage info 60 bash -c "$(declare -f info); info"
SHA=$(git -C "$ROOT" rev-parse --short=12 HEAD 2>/dev/null || echo unknown)

# ---- 1. configure and build ---------------------------------------------------------------
BUILD="$ROOT/build-gpu"
MODE=full
STAGE_NOTE="full project"
if stage configure 120 cmake -S "$ROOT" -B "$BUILD" -DATTN_CUDA=ON "-DCMAKE_CUDA_ARCHITECTURES=$ARCH" \
  -DCMAKE_BUILD_TYPE=Release -DATTN_CUDA_EMULATOR=OFF && cmake --build "$BUILD" --target help 2>/dev/null | grep -q test_cuda_attn; then
  STAGE_NOTE="full project, -j$JOBS"
  if ! stage build 240 cmake --build "$BUILD" -j "$JOBS"; then
    STAGE_NOTE="full build failed: the CUDA targets alone"
    stage build-cuda 180 cmake --build "$BUILD" -j "$JOBS" --target test_cuda_attn bench_cuda
  fi
else
  MODE=standalone
  BUILD="$ROOT/build-gpu-sa"
  note "full project not usable here (no CUDA tests in it, or configure failed): tests/gpu/standalone"
  STAGE_NOTE="tests/gpu/standalone"
  stage configure-standalone 120 cmake -S "$ROOT/tests/gpu/standalone" -B "$BUILD" -DATTN_CUDA=ON \
    "-DCMAKE_CUDA_ARCHITECTURES=$ARCH" -DCMAKE_BUILD_TYPE=Release -DATTN_CUDA_EMULATOR=OFF
  STAGE_NOTE="standalone, -j$JOBS"
  stage build 240 cmake --build "$BUILD" -j "$JOBS"
fi
TEST_BIN="$BUILD/tests/gpu/test_cuda_attn"
BENCH_BIN="$BUILD/bench/gpu/bench_cuda"

# ---- 2. checks ----------------------------------------------------------------------------
stage ptxas-spills 60 ctest --test-dir "$BUILD" -R cuda_ptxas_spills --output-on-failure
# Instruction census of two kernels' machine code: tensor-core MMAs, ldmatrix, cp.async,
# and local-memory traffic (which should be zero).
sass() {
  local obj n
  for k in fwd_hd128_bf16_causal bwd_hd128_bf16; do
    obj=$(find "$BUILD" -name "$k.cu.o" | head -1)
    [ -n "$obj" ] || { echo "no object for $k"; continue; }
    cuobjdump -sass "$obj" >"$BUILD/$k.sass" || return 1
    for ins in HMMA LDSM LDGSTS BAR.SYNC MUFU.EX2 LDL STL; do
      n=$(grep -c "$ins" "$BUILD/$k.sass")
      printf '%s %s=%s\n' "$k" "$ins" "$n"
    done
  done
}
STAGE_NOTE="cuobjdump census in the log"
stage sass 30 bash -c "BUILD='$BUILD'; $(declare -f sass); sass"
CTEST_OUT="$DEST/.ctest.txt"
STAGE_NOTE="ctest -L gpu -j4"
stage tests 240 bash -c "set -o pipefail; ctest --test-dir '$BUILD' -L gpu --output-on-failure -j 4 --timeout 300 | tee '$CTEST_OUT'"
SANITIZER=$(command -v compute-sanitizer || true)
for c in "$(dirname "$(command -v nvcc 2>/dev/null || echo /usr/local/cuda/bin/nvcc)")/compute-sanitizer" \
  /usr/local/cuda/bin/compute-sanitizer /usr/local/cuda/compute-sanitizer/compute-sanitizer; do
  [ -z "$SANITIZER" ] && [ -x "$c" ] && SANITIZER=$c
done
if [ -n "$SANITIZER" ]; then
  STAGE_NOTE="test_cuda_attn quick"
  stage memcheck 150 "$SANITIZER" --tool memcheck --error-exitcode 1 "$TEST_BIN" quick
  STAGE_NOTE="test_cuda_attn quick (shared-memory hazards)"
  stage racecheck 150 "$SANITIZER" --tool racecheck --racecheck-report hazard --error-exitcode 1 "$TEST_BIN" quick
else
  S_NAME+=("sanitizer") S_RES+=("skipped") S_SEC+=("0") S_NOTE+=("compute-sanitizer not found")
fi

# ---- 3. benchmarks ------------------------------------------------------------------------
JSON="$DEST/bench-$DATE-$CARD.jsonl"
MD="$DEST/bench-$DATE-$CARD.md"
: >"$JSON"
nvidia-smi --query-gpu=clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv >>"$LOG" 2>&1
STAGE_NOTE="bf16, d=128/64, N=1K..16K, 16K tokens"
stage bench-attnrun 180 "$BENCH_BIN" --json "$JSON"
STAGE_NOTE="deterministic backward, d=128, N=8K"
stage bench-attnrun-det 40 "$BENCH_BIN" --det --n 8192 --hd 128 --json "$JSON"
STAGE_NOTE="torch SDPA flash + cuDNN"
stage bench-torch 200 env PYTHONUNBUFFERED=1 python3 "$ROOT/bench/gpu/sdpa_bench.py" run --json "$JSON"
nvidia-smi --query-gpu=clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv >>"$LOG" 2>&1
stage compare 30 python3 "$ROOT/bench/gpu/sdpa_bench.py" compare "$JSON" --md "$MD"

# ---- 4. summary ---------------------------------------------------------------------------
TOTAL=$(($(date +%s) - START))
{
  echo "# device check $DATE — $CARD (sm_$CC), attnrun $SHA, $MODE build for $ARCH"
  echo
  echo "| stage | result | seconds | note |"
  echo "|---|---|---|---|"
  for i in "${!S_NAME[@]}"; do
    printf '| %s | %s | %s | %s |\n' "${S_NAME[$i]}" "${S_RES[$i]}" "${S_SEC[$i]}" "${S_NOTE[$i]}"
  done
  echo
  echo "total: ${TOTAL}s"
  if [ -s "$CTEST_OUT" ]; then
    echo
    echo "## CUDA tests"
    echo
    echo '```'
    grep -E "Test +#|tests passed|tests failed|Not Run|\*\*\*" "$CTEST_OUT"
    echo '```'
  fi
  if [ -s "$MD" ]; then
    echo
    echo "## benchmark"
    echo
    cat "$MD"
  fi
} >"$DEST/summary.md"
rm -f "$CTEST_OUT"
echo
cat "$DEST/summary.md"
echo "(log: $LOG)"
