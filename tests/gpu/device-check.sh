#!/usr/bin/env bash
# tests/gpu/device-check.sh — the one script a GPU session runs (budget: under 8 minutes):
# device info, the prebuilt bundle (or a build: the full project with -DATTN_CUDA=ON, else the
# CUDA part alone from tests/gpu/standalone), the ptxas spill check, every CUDA test
# (ctest -L gpu, the MPI/NCCL ones included), the benchmark side by side with PyTorch SDPA
# (flash, cuDNN; the sm90 rows only once the Hopper tests passed), then as the budget
# allows `mpiexec -np 8 attnrun --seq 1M` on the default backend (it must pick cuda), the
# generic tests again on mma.sync (ATTN_CUDA_HOPPER=0; the Hopper kernels are
# the default on sm_90), compute-sanitizer memcheck and racecheck on small shapes, random
# problems through attnrun, and Nsight Compute's counters (stall reasons, occupancy,
# throughput) of the slowest kernels. Every stage is timed and `timeout`-wrapped; a failing
# stage is recorded and the script goes on. Ends with a summary table.
#
# How a GPU session calls it: first, on the CPU machine, `bash tests/gpu/bundle.sh` (builds
# .gpu-bundle/: the binaries for sm_90a and the Open MPI/PMIx/hwloc/BLAS libraries a bare
# CUDA image lacks, and .gpu-bundle.tar.gz, the same gzipped: the folder alone is over the
# 64 MiB carry limit); then the device tool's run with
#   carry: [".gpu-bundle.tar.gz"], command: "bash tests/gpu/device-check.sh", timeout_s: 560
# A run that runs out of budget prints, at the end of its summary, an ATTN_CHECK_ONLY=...
# command for the stages it skipped: call the device tool with it (the same carry) at once,
# while the machine is still warm (it goes back after a short idle time).
# The first stage unpacks the tarball into .gpu-bundle/ (tar, else python3's tarfile; again on
# every run, since a warm machine keeps the folder of an earlier one). A .gpu-bundle/ folder
# carried as such (carry: [".gpu-bundle"]) is used as it is.
# With a bundle whose binaries run here (mode "bundle") nothing is built on the device; when
# they cannot run (a missing library, another GPU architecture) it builds here as before,
# against the bundle's MPI/hwloc/BLAS when present. The summary says which mode ran.
#
# Writes to $OUT when set (device-check.log, summary.md, bench-<date>-<card>.jsonl / .md),
# else to bench/results/. Environment: ATTN_CHECK_BUDGET_S (default 450: no stage starts
# after that), ATTN_CHECK_JOBS (default 16), ATTN_CHECK_ARCH (default: the device's, e.g. 90a),
# ATTN_CHECK_BUNDLE (auto: run .gpu-bundle/'s programs when they work; off: build here, still
# against the bundle's libraries), ATTN_CHECK_CTEST_JOBS (default 8: the GPU tests' oracles
# run on the host's cores), ATTN_CHECK_ONLY (an extended regex: only the stages whose names
# match run, besides the set-up ones; the summary of a run that ran out of budget prints the
# value that runs what it skipped, for a second call on the still-warm machine) and
# ATTN_CHECK_PATH (the benchmark's --path when the tests stage is not selected; default
# auto, which includes the sm90 rows and their stages).
set -u -o pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT" || exit 1
# The toolkit's tools (nvcc, cuobjdump, compute-sanitizer) when its bin/ is not on PATH.
command -v nvcc >/dev/null || [ ! -x /usr/local/cuda/bin/nvcc ] || PATH="$PATH:/usr/local/cuda/bin"
START=$(date +%s)
BUDGET=${ATTN_CHECK_BUDGET_S:-450}
JOBS=${ATTN_CHECK_JOBS:-16}
DATE=$(date -u +%Y-%m-%d)
DEST=${OUT:-$ROOT/bench/results}
mkdir -p "$DEST"
LOG="$DEST/device-check.log"
: >"$LOG"
S_NAME=() S_RES=() S_SEC=() S_NOTE=()
ONLY=${ATTN_CHECK_ONLY:-}
# the stages every run needs (the bundle or the build they set up), whatever ONLY says
SETUP_STAGES='^(unpack|info|bundle-smoke|bundle-mpi|configure|configure-standalone|build|build-cuda)$'
# selected NAME: whether stage NAME runs under ATTN_CHECK_ONLY (compare: whenever a
# benchmark stage left records)
selected() {
  [ -z "$ONLY" ] || [[ $1 =~ $SETUP_STAGES ]] || [[ $1 =~ $ONLY ]] || [[ $1 == compare && -s ${JSON:-} ]]
}

note() { echo "$*" | tee -a "$LOG"; }

# stage NAME LIMIT_S COMMAND... — runs COMMAND (appending to the log) under timeout.
stage() {
  local name=$1 limit=$2 left rc t0 t1 res
  shift 2
  if ! selected "$name"; then # not asked for: no row, no log beyond this line
    STAGE_NOTE=""
    echo "==== $name: not selected (ATTN_CHECK_ONLY)" >>"$LOG"
    return 98
  fi
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

# ---- 0. the bundle's tarball, unpacked ------------------------------------------------------
# A folder without .unpacked-from was carried as a folder: it wins. One with it came from a
# tarball on an earlier run here: replaced, so that a newer tarball is never shadowed.
TARBALL="$ROOT/.gpu-bundle.tar.gz"
if [ -f "$TARBALL" ]; then
  if [ -d "$ROOT/.gpu-bundle" ] && [ ! -f "$ROOT/.gpu-bundle/.unpacked-from" ]; then
    note "bundle: both .gpu-bundle/ (carried as a folder) and .gpu-bundle.tar.gz are here: using the folder"
  else
    STAGE_NOTE="$(du -m "$TARBALL" | cut -f1) MiB .gpu-bundle.tar.gz"
    [ -d "$ROOT/.gpu-bundle" ] && STAGE_NOTE="$STAGE_NOTE, replacing an earlier run's folder"
    if stage unpack 120 bash -c ". '$ROOT/tests/gpu/bundle-env.sh' && attn_bundle_unpack '$TARBALL' '$ROOT'"; then
      S_NOTE[${#S_NOTE[@]}-1]+=", with $(cut -d' ' -f2 "$ROOT/.gpu-bundle/.unpacked-from")"
    elif [ -d "$ROOT/.gpu-bundle" ]; then
      note "bundle: unpacking failed; an earlier run's .gpu-bundle/ is left (its sources are checked below)"
    fi
  fi
fi

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
STAGE_NOTE="$CARD, sm_$CC"
stage info 60 bash -c "$(declare -f info); info"
SHA=$(git -C "$ROOT" rev-parse --short=12 HEAD 2>/dev/null ||
  sed -n 's/^git_sha=\(.\{12\}\).*/\1 (the bundle'"'"'s)/p' "$ROOT/.gpu-bundle/manifest.txt" 2>/dev/null)
[ -n "$SHA" ] || SHA=unknown

# ---- 1. the prebuilt bundle, else configure and build ------------------------------------
BUNDLE="$ROOT/.gpu-bundle"
BUNDLE_NOTE=""
PYPKGS=""
BUILD=""
MODE="device build"
mf() { sed -n "s/^$1=//p" "$BUNDLE/manifest.txt" 2>/dev/null | head -1; }
# The CTest files and the mpiexec path in the bundle name the machine it was built on
# (source_dir in the manifest): make that path lead here. The machine is throwaway, so a
# symlink at that path is all this writes outside the repository; when something else
# already sits there, the bundle's own files are rewritten instead.
bundle_relocate() {
  local src rel f
  src=$(mf source_dir)
  [ -n "$src" ] || { note "bundle: manifest has no source_dir"; return 1; }
  [ "$(readlink -f "$src" 2>/dev/null)" = "$(readlink -f "$ROOT")" ] && return 0
  if [ ! -e "$src" ] && [ ! -L "$src" ] && mkdir -p "$(dirname "$src")" && ln -s "$ROOT" "$src"; then
    note "bundle: $src -> $ROOT (symlink)"
    return 0
  fi
  rel=$(cat "$BUNDLE/.relocated-from" 2>/dev/null || echo "$src")
  note "bundle: $src is taken here; rewriting the bundle's paths from $rel to $ROOT"
  for f in $(grep -rlF --include=CTestTestfile.cmake --include=CMakeCache.txt "$rel" "$BUNDLE/build"); do
    sed -i "s|$rel|$ROOT|g" "$f" || return 1
  done
  echo "$ROOT" >"$BUNDLE/.relocated-from"
}
# The CTest files run the bundle machine's cmake (-E env, -P scripts) by its absolute path
# (CMAKE_COMMAND in the cache). Where that path is not a program here, point them at the
# cmake on this PATH.
bundle_cmake() {
  local was here f
  was=$(sed -n 's/^CMAKE_COMMAND:INTERNAL=//p' "$BUNDLE/build/CMakeCache.txt" 2>/dev/null | head -1)
  [ -n "$was" ] || { note "bundle: no CMAKE_COMMAND in the bundle's cache"; return 1; }
  [ -x "$was" ] && return 0
  here=$(command -v cmake) || { note "bundle: the CTest files name $was and no cmake is on PATH"; return 1; }
  note "bundle: $was is not here; the CTest files now run $here"
  for f in $(grep -rlF --include=CTestTestfile.cmake --include=CMakeCache.txt "$was" "$BUNDLE/build"); do
    sed -i "s|$was|$here|g" "$f" || return 1
  done
}
# bundle_setup: in this shell (the stages inherit its environment): relocate, compare the
# sources with those the bundle was built from, set the bundle's library environment.
bundle_setup() {
  local stale
  . "$BUNDLE/bundle-env.sh" || return 1
  bundle_relocate || return 1
  bundle_cmake || return 1
  stale=$(cd "$ROOT" && timeout 60 sha256sum -c "$BUNDLE/sources.sha256" 2>/dev/null | grep -cv ': OK$')
  BUNDLE_NOTE="bundle of git $(mf git_sha | cut -c1-12) built $(mf built_utc) for sm_$(mf cuda_arch)"
  if [ "${stale:-0}" != 0 ]; then
    BUNDLE_NOTE="$BUNDLE_NOTE, STALE: $stale tracked files differ from the tree (rerun tests/gpu/bundle.sh)"
    (cd "$ROOT" && sha256sum -c "$BUNDLE/sources.sha256" 2>/dev/null | grep -v ': OK$' | head -20) >>"$LOG"
  fi
  note "$BUNDLE_NOTE"
  attn_bundle_env "$BUNDLE" || return 1
  note "bundle: fallback libraries in use:$(attn_bundle_fallback_list "$BUNDLE")"
  note "bundle: LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
  PYPKGS=$(timeout 30 python3 -c 'import importlib.metadata as m
print(" ".join(sorted(d.metadata["Name"] + "==" + d.version for d in m.distributions()
  if d.metadata["Name"].lower().startswith(("nvidia-nccl", "nvidia-cuda-runtime", "torch")))))' 2>/dev/null)
  note "bundle: python packages: ${PYPKGS:-none found}"
}
# Whether the prebuilt GPU programs can run here at all: every library resolves, and
# test_cuda_attn quick gets past loading its kernels. A failing check is a test result,
# not a reason to rebuild; only "cannot load" is.
bundle_smoke() {
  local b="$BUNDLE/build" f rc out
  for f in tests/gpu/test_cuda_attn tests/gpu/test_cuda_runtime tests/gpu/test_nccl launch/attnrun bench/gpu/bench_cuda; do
    [ -e "$b/$f" ] || { echo "$f: not in the bundle"; continue; }
    echo "---- ldd $f"
    ldd "$b/$f"
  done
  if ldd "$b"/tests/gpu/test_* "$b/launch/attnrun" 2>&1 | grep 'not found'; then
    echo "bundle: unresolved libraries (above)"
    return 1
  fi
  out=$("$b/tests/gpu/test_cuda_attn" quick 2>&1)
  rc=$?
  echo "$out" | tail -40
  echo "test_cuda_attn quick: exit $rc"
  if ((rc == 126 || rc == 127)) || echo "$out" | grep -qiE \
    'error while loading shared|no kernel image|NoKernelImage|invalid device function|PTX was compiled|unsupported toolchain'; then
    echo "bundle: the prebuilt GPU binary cannot run on this device"
    return 1
  fi
  return 0
}
# Two ranks of the CLI (CPU backend, a ring): Open MPI, PMIx and shared memory, relocated.
bundle_mpi() {
  timeout 90 mpiexec -np 2 --oversubscribe --timeout 60 --bind-to none "$BUNDLE/build/launch/attnrun" \
    --mode ring --seq 4K --heads 2 --head-dim 64 --check 4 --backend cpu --no-bind
}
if [ -f "$BUNDLE/manifest.txt" ]; then
  if ! bundle_setup; then
    note "bundle: set-up failed, building on the device"
  elif [ "${ATTN_CHECK_BUNDLE:-auto}" = off ]; then
    note "bundle: ATTN_CHECK_BUNDLE=off, building on the device (against the bundle's libraries)"
  else
    STAGE_NOTE="ldd + test_cuda_attn quick from the bundle"
    if stage bundle-smoke 90 bash -c "BUNDLE='$BUNDLE'; $(declare -f bundle_smoke); bundle_smoke"; then
      MODE=bundle
      BUILD="$BUNDLE/build"
      STAGE_NOTE="mpiexec -np 2 attnrun --mode ring (cpu)"
      stage bundle-mpi 100 bash -c "BUNDLE='$BUNDLE'; $(declare -f bundle_mpi); bundle_mpi"
    fi
  fi
fi

if [ "$MODE" = bundle ]; then
  ARCH=$(mf cuda_arch)
else
  BUILD="$ROOT/build-gpu"
  CFG_EXTRA=()
  if [ -n "${ATTN_BUNDLE:-}" ] && [ -d "$BUNDLE/sysroot" ]; then
    # The bundle's MPI, hwloc and BLAS (headers, .pc files, libraries) for the full project.
    attn_sysroot_pkgconfig_env "$BUNDLE/sysroot"
    mapfile -t CFG_EXTRA < <(attn_sysroot_cmake_args "$BUNDLE/sysroot" "$BUNDLE/bin/pkg-config")
    CFG_EXTRA+=("-DMPIEXEC_EXECUTABLE=$BUNDLE/bin/mpiexec")
    MODE="device build (the bundle's MPI/hwloc/BLAS)"
  fi
  STAGE_NOTE="full project"
  if stage configure 120 cmake -S "$ROOT" -B "$BUILD" -DATTN_CUDA=ON "-DCMAKE_CUDA_ARCHITECTURES=$ARCH" \
    -DCMAKE_BUILD_TYPE=Release -DATTN_CUDA_EMULATOR=OFF "${CFG_EXTRA[@]}" &&
    cmake --build "$BUILD" --target help 2>/dev/null | grep test_cuda_attn >/dev/null; then
    STAGE_NOTE="full project, -j$JOBS"
    if ! stage build 240 cmake --build "$BUILD" -j "$JOBS"; then
      STAGE_NOTE="full build failed: the CUDA targets alone"
      stage build-cuda 180 cmake --build "$BUILD" -j "$JOBS" --target test_cuda_attn test_cuda_decode bench_cuda bench_cuda_decode bench_roofline
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
fi
TEST_BIN="$BUILD/tests/gpu/test_cuda_attn"
BENCH_BIN="$BUILD/bench/gpu/bench_cuda"

# ---- 2. checks ----------------------------------------------------------------------------
stage ptxas-spills 60 ctest --test-dir "$BUILD" -R cuda_ptxas_spills --output-on-failure
# Instruction census of nine kernels' machine code (the sm90 backward: one non-causal, one
# causal; the sm90 forward and backward at d = 64 too, and both at 256): tensor-core MMAs (HMMA: mma.sync, HGMMA: wgmma), ldmatrix, cp.async, TMA loads
# (UTMALDG), setmaxnreg (USETMAXREG), float32 reductions (RED: the sm90 backward's dQ
# atomics), and local-memory traffic (which should be zero).
sass() {
  local obj n
  for k in fwd_hd128_bf16_causal bwd_hd128_bf16 fwd_hd128_bf16_causal_sm90 bwd_hd128_bf16_sm90 \
           bwd_hd128_f16_causal_sm90 fwd_hd64_bf16_sm90 bwd_hd64_bf16_causal_sm90 fwd_hd256_bf16_sm90 \
           bwd_hd256_bf16_sm90; do
    obj=$(find "$BUILD" -name "$k.cu.o" | head -1)
    [ -n "$obj" ] || { echo "no object for $k"; continue; }
    cuobjdump -sass "$obj" >"$BUILD/$k.sass" || return 1
    for ins in HMMA HGMMA LDSM LDGSTS UTMALDG USETMAXREG BAR.SYNC MUFU.EX2 RED LDL STL; do
      n=$(grep -c "$ins" "$BUILD/$k.sass")
      printf '%s %s=%s\n' "$k" "$ins" "$n"
    done
  done
}
STAGE_NOTE="cuobjdump census in the log"
stage sass 30 bash -c "BUILD='$BUILD'; $(declare -f sass); sass"
CTEST_OUT="$DEST/.ctest.txt"
CTEST_JOBS=${ATTN_CHECK_CTEST_JOBS:-8}
STAGE_NOTE="ctest -L gpu -j$CTEST_JOBS"
stage tests 240 bash -c "set -o pipefail; ctest --test-dir '$BUILD' -L gpu --output-on-failure -j $CTEST_JOBS --timeout 300 | tee '$CTEST_OUT'"
# ---- 3. benchmarks ------------------------------------------------------------------------
JSON="$DEST/bench-$DATE-$CARD.jsonl"
MD="$DEST/bench-$DATE-$CARD.md"
: >"$JSON"
nvidia-smi --query-gpu=clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv >>"$LOG" 2>&1
# The sm90 rows only when the Hopper tests passed above (a kernel that hangs there would
# spend this stage's whole limit here too).
BENCH_PATH=mma
if grep -qE "cuda_hopper_fwd .*Passed" "$CTEST_OUT" 2>/dev/null &&
  grep -qE "cuda_hopper_bwd .*Passed" "$CTEST_OUT"; then
  BENCH_PATH=auto
fi
selected tests || BENCH_PATH=${ATTN_CHECK_PATH:-auto} # a second call: the first one's tests decided
STAGE_NOTE="bf16, d=128/64, N=1K..16K, 16K tokens; --path $BENCH_PATH (auto: mma and sm90 side by side)"
stage bench-attnrun 150 "$BENCH_BIN" --path "$BENCH_PATH" --json "$JSON"
# The ceilings the kernels are judged against, measured on this card: mma.sync, ldmatrix
# feeding 2 or 4 MMAs a load (the 8-warp and FlashAttention-2 warp shapes), ex2, and 32 KiB
# tile streams by cp.async and the bulk-copy engine against a copy (compare's roofline table).
STAGE_NOTE="bench_roofline: mma.sync / ldmatrix / ex2 rates an SM, tile streams vs a copy"
stage bench-roofline 40 "$BUILD/bench/gpu/bench_roofline" --json "$JSON"
STAGE_NOTE="the mma.sync forward's 4-warp kernel (ATTN_CUDA_FWD_WARPS=4: two CTAs an SM), d=128/64, N=1K..16K"
stage bench-mma4 60 env ATTN_CUDA_FWD_WARPS=4 "$BENCH_BIN" --path mma --no-bwd --json "$JSON"
STAGE_NOTE="the mma.sync forward's two-CTA 8-warp kernel (ATTN_CUDA_FWD_CTAS=2: 128 registers, Q from shared memory), d=128/64, N=1K..16K"
stage bench-mma2c 60 env ATTN_CUDA_FWD_CTAS=2 "$BENCH_BIN" --path mma --no-bwd --json "$JSON"
STAGE_NOTE="the mma.sync forward's 4-warp kernel of 32-row warps (ATTN_CUDA_FWD_WARP_ROWS=32: FlashAttention-2's 128-row CTA, two an SM), d=128/64, N=1K..16K"
stage bench-mma4x32 60 env ATTN_CUDA_FWD_WARP_ROWS=32 "$BENCH_BIN" --path mma --no-bwd --json "$JSON"
STAGE_NOTE="the mma.sync kernels with 4 buffers (ATTN_CUDA_FWD_STAGES=4: K/V tiles, ATTN_CUDA_BWD_STAGES=4: dK/dV's Q/dO steps; 3 in flight, not 1), fwd+bwd, d=128/64, N=1K..16K"
stage bench-mma4s 60 env ATTN_CUDA_FWD_STAGES=4 ATTN_CUDA_BWD_STAGES=4 "$BENCH_BIN" --path mma --json "$JSON"
STAGE_NOTE="deterministic backward, d=128, N=8K; --path $BENCH_PATH (auto: the sm90 dQ in key-block order beside mma.sync)"
stage bench-attnrun-det 60 "$BENCH_BIN" --det --path "$BENCH_PATH" --n 8192 --hd 128 --json "$JSON"
# Where the mma.sync forward's time goes (0.17x torch at d=128 on 2026-12-04): its ablation
# kernel with stages left out (ATTN_MMA_ABLATE bits, instance.h FA_AB_*; 2 only with 1),
# one run a mask, mask 0 (nothing left out) first; compare's table prints each against it.
STAGE_NOTE="ATTN_MMA_ABLATE=0,1,3,4,8,16,12,20,28,31: mma.sync fwd d=128 N=8K, stages left out"
stage bench-mma-ablate 60 bash -c 'for m in 0 1 3 4 8 16 12 20 28 31; do
    ATTN_MMA_ABLATE=$m "$0" --path mma --no-bwd --n 8192 --hd 128 --reps 5 --warmup 2 --json "$1" || exit 1
  done' "$BENCH_BIN" "$JSON"
STAGE_NOTE="torch SDPA flash + cuDNN"
stage bench-torch 150 env PYTHONUNBUFFERED=1 LD_LIBRARY_PATH="${ATTN_ORIG_LD_LIBRARY_PATH-${LD_LIBRARY_PATH:-}}" python3 "$ROOT/bench/gpu/sdpa_bench.py" run --json "$JSON"
nvidia-smi --query-gpu=clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv >>"$LOG" 2>&1
# The sm90 backward's other dQ mode (atomics, ATTN_SM90_DQ=0) against the default (TMA
# reduce-adds) rows above: "attnrun-sm90-dqatomic" records in the same file.
if [ "$BENCH_PATH" = auto ]; then
  STAGE_NOTE="ATTN_SM90_DQ=0: sm90, d=128/64, N=8K,16K"
  stage bench-dq-atomic 60 env ATTN_SM90_DQ=0 "$BENCH_BIN" --path sm90 --n 8192,16384 --json "$JSON"
  # Where the sm90 backward's time goes (0.36x cuDNN on 2026-12-04): the same shape with
  # stages left out (ATTN_SM90_ABLATE bits, bwd_sm90_body.cuh G_AB_*), one run a mask, mask
  # 0 (the full kernel) first; compare's third table prints each against it.
  STAGE_NOTE="ATTN_SM90_ABLATE=0,1,3,6,8,16,32,24,56,62: sm90 bwd d=128 N=8K, stages left out"
  stage bench-ablate 60 bash -c 'for m in 0 1 3 6 8 16 32 24 56 62; do
      ATTN_SM90_ABLATE=$m "$0" --path sm90 --n 8192 --hd 128 --reps 5 --warmup 2 --json "$1" || exit 1
    done' "$BENCH_BIN" "$JSON"
fi
# Decode steps (packed GQA, split-KV) against a copy of the same cache bytes, then torch's
# SDPA on the same shapes: "mode": "decode" records, compare's second table.
STAGE_NOTE="decode: bf16 d=128, Sq=1, 7 shapes up to 256K cached tokens; planned vs plain vs paged (16-row pages) vs copy"
stage bench-decode 60 "$BUILD/bench/gpu/bench_cuda_decode" --json "$JSON"
STAGE_NOTE="decode as above on the 8-warp kernel with a 4-buffer K/V ring (ATTN_CUDA_FWD_STAGES=4): \"-4s\" records"
stage bench-decode-4s 60 env ATTN_CUDA_FWD_STAGES=4 "$BUILD/bench/gpu/bench_cuda_decode" --json "$JSON"
STAGE_NOTE="decode as above on the key-split decode kernel (ATTN_CUDA_FWD_KSPLIT=1: 16 rows, the warps split each key tile, plain form too): \"-ks\" records"
stage bench-decode-ks 60 env ATTN_CUDA_FWD_KSPLIT=1 "$BUILD/bench/gpu/bench_cuda_decode" --json "$JSON"
STAGE_NOTE="torch SDPA decode: flash, efficient, cuDNN"
stage bench-torch-decode 60 env PYTHONUNBUFFERED=1 LD_LIBRARY_PATH="${ATTN_ORIG_LD_LIBRARY_PATH-${LD_LIBRARY_PATH:-}}" python3 "$ROOT/bench/gpu/sdpa_bench.py" decode --json "$JSON"
stage compare 30 python3 "$ROOT/bench/gpu/sdpa_bench.py" compare "$JSON" --md "$MD"

# ---- 3b. after the benchmarks, as the budget allows ----------------------------------------
# The issue's own target: `mpirun -np 8 attnrun --seq 1M` with the default backend picks
# CUDA on a GPU machine (here eight ranks share the one GPU: the ring over the MPI-staged
# transport), and its --check passes. Its JSON record in seq1m-np8.jsonl.
seq1m() {
  local out rc
  out=$(OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout 130 mpiexec -np 8 \
    --oversubscribe --bind-to none --timeout 120 "$BUILD/launch/attnrun" --seq 1M --iters 1 \
    --warmup 0 --check 16 --json "$DEST/seq1m-np8.jsonl" 2>&1)
  rc=$?
  echo "$out"
  ((rc == 0)) || { echo "seq1m: exit $rc"; return 1; }
  echo "$out" | grep -q '^# backend cuda' || { echo "seq1m: the default backend was not cuda"; return 1; }
  echo "$out" | grep -q 'OK: 0 wrong elements' || { echo "seq1m: --check did not pass"; return 1; }
}
STAGE_NOTE="mpiexec -np 8 attnrun --seq 1M --check 16, default backend: must pick cuda (8 ranks on the GPU)"
stage seq1m-np8 140 bash -c "BUILD='$BUILD' DEST='$DEST'; $(declare -f seq1m); seq1m"
# The Hopper kernels are the default on sm_90 (the ctest run above used them wherever
# dispatch.c takes them); the generic parts again on the mma.sync kernels
# (ATTN_CUDA_HOPPER=0), which other GPUs and the sm90 fallbacks run.
STAGE_NOTE="ATTN_CUDA_HOPPER=0: fwd bwd flags windows empty quick block dims, ring on mma.sync"
stage tests-mma 200 env ATTN_CUDA_HOPPER=0 ctest --test-dir "$BUILD" -L gpu -R 'cuda_(fwd|bwd|flags|windows|empty|quick|block|dims)$|cuda_ring' --output-on-failure -j 4 --timeout 180
SANITIZER=$(command -v compute-sanitizer || true)
for c in "$(dirname "$(command -v nvcc 2>/dev/null || echo /usr/local/cuda/bin/nvcc)")/compute-sanitizer" \
  /usr/local/cuda/bin/compute-sanitizer /usr/local/cuda/compute-sanitizer/compute-sanitizer; do
  [ -z "$SANITIZER" ] && [ -x "$c" ] && SANITIZER=$c
done
if [ -n "$SANITIZER" ]; then
  STAGE_NOTE="test_cuda_attn quick (the Hopper kernels, the default on sm_90)"
  stage memcheck-hopper 150 "$SANITIZER" --tool memcheck --error-exitcode 1 "$TEST_BIN" quick
  STAGE_NOTE="test_cuda_attn quick, ATTN_CUDA_HOPPER=0 (mma.sync)"
  stage memcheck 150 env ATTN_CUDA_HOPPER=0 "$SANITIZER" --tool memcheck --error-exitcode 1 "$TEST_BIN" quick
  STAGE_NOTE="test_cuda_decode block (packed GQA + split-KV into a carried state)"
  stage memcheck-decode 90 "$SANITIZER" --tool memcheck --error-exitcode 1 "$BUILD/tests/gpu/test_cuda_decode" block
  STAGE_NOTE="test_cuda_decode cache (K/V rows through a shuffled block table)"
  stage memcheck-cache 90 "$SANITIZER" --tool memcheck --error-exitcode 1 "$BUILD/tests/gpu/test_cuda_decode" cache
  STAGE_NOTE="test_cuda_attn quick (shared-memory hazards; on mma.sync, as it passed on 2026-12-04)"
  stage racecheck 150 env ATTN_CUDA_HOPPER=0 "$SANITIZER" --tool racecheck --racecheck-report hazard --error-exitcode 1 "$TEST_BIN" quick
  STAGE_NOTE="the same on the 4-stage kernels (ATTN_CUDA_FWD_STAGES=4: tile descriptors in shared memory; ATTN_CUDA_BWD_STAGES=4)"
  stage racecheck-4s 150 env ATTN_CUDA_HOPPER=0 ATTN_CUDA_FWD_STAGES=4 ATTN_CUDA_BWD_STAGES=4 "$SANITIZER" --tool racecheck --racecheck-report hazard --error-exitcode 1 "$TEST_BIN" quick
  STAGE_NOTE="test_cuda_decode block on the key-split decode kernel (ATTN_CUDA_FWD_KSPLIT=1: the warps' states merged through the K/V buffers)"
  stage racecheck-ks 90 env ATTN_CUDA_FWD_KSPLIT=1 "$SANITIZER" --tool racecheck --racecheck-report hazard --error-exitcode 1 "$BUILD/tests/gpu/test_cuda_decode" block
else
  [ -n "$ONLY" ] || S_NAME+=("sanitizer") S_RES+=("skipped") S_SEC+=("0") S_NOTE+=("compute-sanitizer not found")
fi
# Hardware counters of the kernels furthest from their targets (ncu, --clock-control none as
# the device notes ask; one launch each, d=128 bf16 N=8K non-causal, the bench's validating
# call): the mma.sync forward (0.17x cuDNN on 2026-12-04), the sm90 backward (0.36x) and the
# mma.sync dK/dV kernel; and the decode plan's mma.sync forward (B=1, 32 query heads on 8 KV
# heads, 128K keys: 4 heads packed a CTA, 15 splits, one busy warp of 8 a CTA; its key tiles
# took 6.6 us on 2026-12-04, as long as a dense tile's; the exact kernel name skips the plain
# form, which runs the sm90 kernel on sm_90); and that plain form's sm90 forward (B=1, 16
# query heads on one KV head, 64K keys: 16 busy CTAs of one row each, 12 us a 128-key tile on
# 2026-12-04 against about 2.6 us for a dense 176-key tile at full load); and the key-split
# decode kernel on decode-gqa's shape (ATTN_CUDA_FWD_KSPLIT=1). Reports in ncu-<name>.txt.
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
DECODE_BIN="$BUILD/bench/gpu/bench_cuda_decode"
# the profiled runs: NAME KERNEL PROGRAM ARGS... (word-split: no spaces inside an argument)
NCU_BENCH="$BENCH_BIN --n 8192 --hd 128 --reps 1 --warmup 0"
NCU_SPECS=("mma-fwd flash_fwd_hd128_bf16 $NCU_BENCH --path mma --no-bwd"
  "sm90-bwd flash_bwd_hd128_bf16_sm90 $NCU_BENCH --path sm90"
  "mma-dkdv flash_dkdv_hd128_bf16 $NCU_BENCH --path mma"
  "decode-gqa flash_fwd_hd128_bf16_causal $DECODE_BIN --shapes 1/32/8/131072 --reps 1 --warmup 0"
  "decode-sm90 flash_fwd_hd128_bf16_causal_sm90 $DECODE_BIN --shapes 1/16/1/65536 --reps 1 --warmup 0"
  "decode-ks flash_fwdks_hd128_bf16_causal env ATTN_CUDA_FWD_KSPLIT=1 $DECODE_BIN --shapes 1/32/8/131072 --reps 1 --warmup 0")
profile() { # profile NAME KERNEL PROGRAM ARGS...
  local name=$1 kernel=$2
  shift 2
  "$NCU" --clock-control none -k "$kernel" -c 1 --section SpeedOfLight --section Occupancy \
    --section LaunchStats --section WarpStateStats --section SchedulerStats \
    --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis \
    "$@" 2>&1 | tee "$DEST/ncu-$name.txt"
  return "${PIPESTATUS[0]}"
}
if [ -n "$NCU" ] && [ -x "$BENCH_BIN" ]; then
  for spec in "${NCU_SPECS[@]}"; do
    read -r pname pkernel _ <<<"$spec"
    STAGE_NOTE="ncu: $pkernel (ncu-$pname.txt)"
    stage "ncu-$pname" 60 bash -c "$(declare -f profile); NCU='$NCU' DEST='$DEST' profile $spec"
  done
  # Where in a kernel the warps stall: the PC-sampling source counters into a report
  # (ncu-NAME-source.ncu-rep), then, if this ncu can print it, its SASS page with
  # per-instruction samples (ncu-NAME-source.csv); the report comes back either way.
  source_profile() { # source_profile NAME KERNEL PROGRAM ARGS...
    local name=$1 kernel=$2
    shift 2
    "$NCU" --clock-control none -k "$kernel" -c 1 --section SourceCounters --section WarpStateStats \
      -f -o "$DEST/ncu-$name-source" "$@" >/dev/null &&
      { "$NCU" --import "$DEST/ncu-$name-source.ncu-rep" --page source --print-source sass --csv \
        >"$DEST/ncu-$name-source.csv" || echo "this ncu did not print the source page"; }
  }
  for spec in "${NCU_SPECS[0]}" "${NCU_SPECS[1]}" "${NCU_SPECS[3]}" "${NCU_SPECS[4]}"; do
    read -r pname pkernel _ <<<"$spec"
    STAGE_NOTE="ncu: $pkernel source counters (ncu-$pname-source.*)"
    stage "ncu-$pname-source" 60 bash -c "$(declare -f source_profile); NCU='$NCU' DEST='$DEST' source_profile $spec"
  done
else
  [ -n "$ONLY" ] || S_NAME+=("ncu") S_RES+=("skipped") S_SEC+=("0") S_NOTE+=("no ncu on PATH or no bench binary")
fi

# Random problems through attnrun --backend cuda (the default kernels), each against the
# float64 oracle, for what time is left; the log has each command (tests/cli/random_sweep.py).
STAGE_NOTE="random_sweep.py, seed = day of the year, 1 rank"
stage random 75 python3 "$ROOT/tests/cli/random_sweep.py" --attnrun "$BUILD/launch/attnrun" --backend cuda \
  --max-ranks 1 --count 200 --seconds 50 --timeout 20 --seed "$((10#$(date +%j)))"

# ---- 4. summary ---------------------------------------------------------------------------
TOTAL=$(($(date +%s) - START))
{
  echo "# device check $DATE — $CARD (sm_$CC), attnrun $SHA, mode: $MODE, for sm_$ARCH"
  echo
  [ -n "$BUNDLE_NOTE" ] && echo "$BUNDLE_NOTE" && echo
  echo "| stage | result | seconds | note |"
  echo "|---|---|---|---|"
  for i in "${!S_NAME[@]}"; do
    printf '| %s | %s | %s | %s |\n' "${S_NAME[$i]}" "${S_RES[$i]}" "${S_SEC[$i]}" "${S_NOTE[$i]}"
  done
  echo
  echo "total: ${TOTAL}s"
  [ -n "$ONLY" ] && echo && echo "ATTN_CHECK_ONLY='$ONLY': the other stages were not run"
  # the stages the budget cut, as the ATTN_CHECK_ONLY of a second call that runs them
  skipped=()
  for i in "${!S_NAME[@]}"; do
    [ "${S_NOTE[$i]}" = "out of time budget" ] && skipped+=("${S_NAME[$i]}")
  done
  if ((${#skipped[@]})); then
    echo
    echo "Out of budget: ${#skipped[@]} stages did not run. On the still-warm machine, run them with"
    echo "ATTN_CHECK_ONLY='^($(IFS='|'; echo "${skipped[*]}"))\$' bash tests/gpu/device-check.sh"
  fi
  if [ -s "$CTEST_OUT" ]; then
    echo
    echo "## CUDA tests"
    echo
    echo '```'
    grep -E "Test +#|tests passed|tests failed|Not Run|\*\*\*" "$CTEST_OUT"
    echo '```'
  fi
  echo
  echo "## libraries the test programs resolved (ldd)"
  echo
  echo '```'
  for f in "$TEST_BIN" "$BUILD/tests/gpu/test_cuda_runtime" "$BUILD/tests/gpu/test_nccl" "$BUILD/launch/attnrun"; do
    [ -e "$f" ] && ldd "$f" 2>&1
  done | grep -E 'not found|lib(mpi|open-pal|pmix|hwloc|nccl|cudart|cublas|gomp|blas|gfortran|event_core)' |
    sed 's/ (0x[0-9a-f]*)//; s/^[[:space:]]*//' | sort -u
  echo '```'
  [ -n "$PYPKGS" ] && echo && echo "python packages: $PYPKGS"
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
