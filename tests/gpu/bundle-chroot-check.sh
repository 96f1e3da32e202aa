#!/usr/bin/env bash
# tests/gpu/bundle-chroot-check.sh — checks the GPU bundle (tests/gpu/bundle.sh) on a stand-in
# for the bare GPU image, without a GPU: a Debian 12 minbase root (debootstrap) with only what
# that image is known to have that matters here (cmake/ctest, python3, a CUDA runtime
# libcudart.so.13 in /usr/local/cuda/lib64, libnccl.so.2 where pip's nvidia-nccl-cu13 puts
# it, cuBLAS 13 (libattnrun links it) in a pip folder as torch's nvidia-cublas would bring it;
# no Open MPI, hwloc, BLAS, libgomp, no libcuda). The tree is copied as the device tool
# copies it (tracked and unignored files plus the carried .gpu-bundle.tar.gz, not the folder)
# and bind-mounted at another path than here. Inside: device-check.sh itself (which must
# unpack the tarball), the python3 tarfile fallback of that unpacking (tar made to fail) giving
# the same files as tar, ldd, the bundled mpiexec with 2 ranks, ctest -L gpu (every test must
# be skipped, none may fail), and some CPU MPI tests through ctest.
# A missing library is the failure this hunts. Root only; maintainers' tool, not run by CI.
# With ATTN_CHROOT_FALLBACK=1 it checks device-check.sh's other path instead: this machine's
# CUDA toolkit (an overlay without its NCCL, so NCCL must come from the pip folder) and gcc
# in the root, the bundle refused (ATTN_CHECK_BUNDLE=off), the full project built there
# against the bundle's MPI/hwloc/BLAS (slow on 2 cores: give it 20 minutes).
#
# Environment: ATTN_CHROOT_CARRY (default .gpu-bundle.tar.gz; .gpu-bundle: carry the folder
# instead, the older way), ATTN_CHROOT (default /tmp/attn-bare: the root, kept between runs),
# ATTN_CHROOT_MIRROR (default http://deb.debian.org/debian), ATTN_CHROOT_OUT (default
# /tmp/attn-chroot-out: device-check.sh's $OUT, copied out). Unmounts everything on exit.
set -u -o pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
FS=${ATTN_CHROOT:-/tmp/attn-bare}
MIRROR=${ATTN_CHROOT_MIRROR:-http://deb.debian.org/debian}
RESULTS=${ATTN_CHROOT_OUT:-/tmp/attn-chroot-out}
COPY="$FS.tree"          # the copy of the tree, outside the root
INNER=/opt/session/repo  # where it appears inside: not this machine's path
CARRY=${ATTN_CHROOT_CARRY:-.gpu-bundle.tar.gz}
TGZ="$ROOT/.gpu-bundle.tar.gz"
MOUNTS=()
die() { echo "bundle-chroot-check: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || die "needs root (debootstrap, chroot, mount)"
case $CARRY in
  .gpu-bundle.tar.gz) [ -f "$TGZ" ] || die "no .gpu-bundle.tar.gz: run tests/gpu/bundle.sh first" ;;
  .gpu-bundle) [ -f "$ROOT/.gpu-bundle/manifest.txt" ] || die "no .gpu-bundle/: run tests/gpu/bundle.sh first" ;;
  *) die "ATTN_CHROOT_CARRY: .gpu-bundle.tar.gz or .gpu-bundle, not $CARRY" ;;
esac

cleanup() {
  local i
  for ((i = ${#MOUNTS[@]} - 1; i >= 0; i--)); do umount "${MOUNTS[$i]}" || umount -l "${MOUNTS[$i]}"; done
}
trap cleanup EXIT
mnt() { # mnt TARGET ARGS... — mount and remember for cleanup
  local t=$1
  shift
  mkdir -p "$t" && mount "$@" "$t" && MOUNTS+=("$t")
}

# ---- the root ----------------------------------------------------------------------------------
if [ ! -f "$FS/etc/debian_version" ]; then
  command -v debootstrap >/dev/null || die "debootstrap not installed (apt-get install debootstrap)"
  timeout 1200 debootstrap --variant=minbase bookworm "$FS" "$MIRROR" >"$FS.debootstrap.log" 2>&1 ||
    die "debootstrap failed ($FS.debootstrap.log)"
fi
cp /etc/resolv.conf "$FS/etc/resolv.conf"
mnt "$FS/proc" -t proc proc
mnt "$FS/sys" --bind /sys
mnt "$FS/dev" --bind /dev
mnt "$FS/dev/shm" --bind /dev/shm
if ! chroot "$FS" sh -c 'command -v ctest && command -v python3' >/dev/null; then
  chroot "$FS" sh -c 'apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends cmake python3' \
    >"$FS.apt.log" 2>&1 || die "apt-get in the root failed ($FS.apt.log)"
fi
# CMake from pip, as on the device (Debian's 3.25 cannot configure CUDA 13 there: its
# FindCUDAToolkit trips over the removed nvToolsExt). The wheel comes through pip here; only
# cmake/ctest/cpack go on PATH (/usr/local/bin), not the venv's python, which lacks nvidia.*.
if [ ! -x "$FS/opt/cmake-pip/bin/cmake" ]; then
  rm -rf "$FS/tmp/wheels" && mkdir -p "$FS/tmp/wheels"
  timeout 300 pip download -q cmake --no-deps --only-binary :all: -d "$FS/tmp/wheels" &&
    chroot "$FS" sh -c 'DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends python3-venv python3-pip &&
      python3 -m venv /opt/cmake-pip && /opt/cmake-pip/bin/pip install -q --no-index /tmp/wheels/*.whl &&
      for t in cmake ctest cpack; do ln -sf /opt/cmake-pip/bin/$t /usr/local/bin/$t; done' >>"$FS.apt.log" 2>&1 ||
    echo "bundle-chroot-check: no pip cmake (see $FS.apt.log); using Debian's" >&2
fi
# The device has no /usr/bin/cmake (its cmake is elsewhere on PATH), and the CTest files name
# the bundle machine's /usr/bin/cmake: hide Debian's so that device-check.sh must cope.
if [ -x "$FS/opt/cmake-pip/bin/cmake" ]; then
  for t in cmake ctest cpack; do [ -e "$FS/usr/bin/$t" ] && mv "$FS/usr/bin/$t" "$FS/usr/bin/$t.debian"; done
fi
# What the CUDA image provides: the toolkit's runtime, and NCCL from a pip package.
CUDART=$(find /usr/local/cuda/lib64/ /usr/local/cuda/targets/x86_64-linux/lib/ -name 'libcudart.so.13*' 2>/dev/null | head -1)
NCCL=$(find /usr/local/cuda/lib64/ /usr/lib/x86_64-linux-gnu/ -name 'libnccl.so.2*' 2>/dev/null | head -1)
PYSITE=$(chroot "$FS" python3 -c 'import sys; print(next(p for p in sys.path if p.endswith("-packages")))')
mkdir -p "$FS/usr/local/cuda/lib64" "$FS$PYSITE/nvidia/nccl/lib"
[ -n "$CUDART" ] && cp -L "$CUDART" "$FS/usr/local/cuda/lib64/libcudart.so.13"
[ -n "$NCCL" ] && [ ! -e "$FS$PYSITE/nvidia/nccl/lib/libnccl.so.2" ] && cp -L "$NCCL" "$FS$PYSITE/nvidia/nccl/lib/libnccl.so.2"
# cuBLAS (libcublasLt is 500+ MB: a hard link when the root is on the same file system).
mkdir -p "$FS$PYSITE/nvidia/cublas/lib"
for so in libcublas.so.13 libcublasLt.so.13; do
  f=$(find /usr/local/cuda/lib64/ /usr/local/cuda/targets/x86_64-linux/lib/ -name "$so" 2>/dev/null | head -1)
  [ -n "$f" ] && [ ! -e "$FS$PYSITE/nvidia/cublas/lib/$so" ] &&
    { ln "$(readlink -f "$f")" "$FS$PYSITE/nvidia/cublas/lib/$so" 2>/dev/null || cp -L "$f" "$FS$PYSITE/nvidia/cublas/lib/$so"; }
done

FALLBACK=${ATTN_CHROOT_FALLBACK:-0}
if [ "$FALLBACK" = 1 ]; then
  if ! chroot "$FS" sh -c 'command -v g++ && command -v make' >/dev/null; then
    chroot "$FS" sh -c 'DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends build-essential' \
      >>"$FS.apt.log" 2>&1 || die "apt-get build-essential in the root failed ($FS.apt.log)"
  fi
  TK=$(readlink -f /usr/local/cuda)
  rm -rf "$FS.cuda-up" "$FS.cuda-work" && mkdir -p "$FS.cuda-up" "$FS.cuda-work"
  mnt "$FS/usr/local/cuda" -t overlay overlay -o "lowerdir=$TK,upperdir=$FS.cuda-up,workdir=$FS.cuda-work"
  rm -f "$FS"/usr/local/cuda/lib/libnccl* "$FS"/usr/local/cuda/include/nccl*.h # whiteouts in the upper dir only
  NCCLH=$(find "$TK/include" /usr/local/include -maxdepth 1 -name nccl.h 2>/dev/null | head -1)
  mkdir -p "$FS$PYSITE/nvidia/nccl/include" && cp "$NCCLH" "$FS$PYSITE/nvidia/nccl/include/"
fi

# ---- the tree, as the device tool copies it ------------------------------------------------------
rm -rf "$COPY" && mkdir -p "$COPY"
(cd "$ROOT" && git ls-files -co --exclude-standard -z | xargs -0 cp -a --parents -t "$COPY") || die "copy failed"
cp -a "$ROOT/$CARRY" "$COPY/" || die "copying $CARRY failed"
mnt "$FS$INNER" --bind "$COPY"
echo "bundle-chroot-check: carried $CARRY ($(du -sm "$COPY/$CARRY" | cut -f1) MB); tree + carry $(du -sm "$COPY" | cut -f1) MB"

# device-check.sh must make the recorded source path itself: remove what an earlier run made.
if [ "$CARRY" = .gpu-bundle ]; then
  SRC0=$(sed -n 's/^source_dir=//p' "$ROOT/.gpu-bundle/manifest.txt")
else
  SRC0=$(tar -xzOf "$TGZ" .gpu-bundle/manifest.txt | sed -n 's/^source_dir=//p')
fi
[ -L "$FS$SRC0" ] && rm -f "$FS$SRC0"

# ---- inside --------------------------------------------------------------------------------------
cat >"$FS/tmp/inside.sh" <<'EOF'
# /tmp/inside.sh (written by tests/gpu/bundle-chroot-check.sh): the checks, in the stand-in root.
set -u -o pipefail
R=$1 CARRY=$2
B=$R/.gpu-bundle
PASS=0 FAIL=0
check() { # check NAME COMMAND... — runs it, prints PASS/FAIL with its tail on failure
  local name=$1 out rc
  shift
  out=$("$@" 2>&1)
  rc=$?
  if [ $rc = 0 ]; then PASS=$((PASS + 1)); echo "PASS $name"; else FAIL=$((FAIL + 1)); echo "FAIL $name (exit $rc)"; echo "$out" | tail -25 | sed 's/^/    /'; fi
  echo "$out" >"/tmp/check-$name.log"
}
device_check() {
  rm -rf /tmp/dc-out && mkdir -p /tmp/dc-out
  env -u ATTN_BUNDLE -u OPAL_PREFIX -u PMIX_PREFIX -u LD_LIBRARY_PATH OUT=/tmp/dc-out ATTN_CHECK_BUDGET_S=300 \
    timeout 500 bash "$R/tests/gpu/device-check.sh" >/tmp/dc-out/stdout.txt 2>&1
  echo "device-check.sh exit $?"
  test -s /tmp/dc-out/summary.md && grep -q 'mode: bundle' /tmp/dc-out/summary.md
}
check device-check device_check
if [ "$CARRY" = .gpu-bundle.tar.gz ]; then
  # device-check.sh unpacked it (a stage of its own) with tar; python3's tarfile, the fallback
  # when tar or gzip is missing or fails, must give the same files, modes and links.
  check device-check-unpacked bash -c "grep -E '^\| unpack \| ok \|' /tmp/dc-out/summary.md && cat '$B/.unpacked-from'"
  unpack_fallback() {
    local d
    rm -rf /tmp/u-tar /tmp/u-py /tmp/shim && mkdir -p /tmp/u-tar /tmp/u-py /tmp/shim || return 1
    printf '#!/bin/sh\necho "tar: made to fail (bundle-chroot-check)" >&2\nexit 2\n' >/tmp/shim/tar && chmod +x /tmp/shim/tar
    (. "$R/tests/gpu/bundle-env.sh" && attn_bundle_unpack "$R/.gpu-bundle.tar.gz" /tmp/u-tar &&
      PATH=/tmp/shim:$PATH attn_bundle_unpack "$R/.gpu-bundle.tar.gz" /tmp/u-py) || return 1
    grep -q ' python3-tarfile$' /tmp/u-py/.gpu-bundle/.unpacked-from || return 1
    for d in u-tar u-py; do
      (cd /tmp/$d && find . ! -name .unpacked-from -printf '%P %m %y %l\n' | sort) >/tmp/$d.list
    done
    echo "$(wc -l </tmp/u-tar.list) entries each"
    diff /tmp/u-tar.list /tmp/u-py.list && diff -r --no-dereference -x .unpacked-from /tmp/u-tar /tmp/u-py
  }
  check unpack-python-fallback unpack_fallback
  rm -rf /tmp/u-tar /tmp/u-py
fi
. "$B/bundle-env.sh"
SRC=$(sed -n 's/^source_dir=//p' "$B/manifest.txt")
[ -e "$SRC" ] || { mkdir -p "$(dirname "$SRC")" && ln -s "$R" "$SRC"; }
attn_bundle_env "$B"
echo "fallback sonames used here:$(attn_bundle_fallback_list "$B")"
no_missing() { ! ldd "$B"/build/tests/gpu/test_* "$B"/build/launch/attnrun "$B"/build/bench/gpu/bench_cuda \
  "$B"/sysroot/usr/bin/orterun "$B"/sysroot/usr/lib/x86_64-linux-gnu/openmpi/lib/openmpi3/*.so 2>&1 | grep 'not found'; }
check ldd-all-resolve no_missing
check ldd-attnrun bash -c "ldd '$B/build/launch/attnrun' | grep -E 'mpi|pmix|hwloc|nccl|gomp|blas|event'"
check mpiexec-true timeout 60 mpiexec -np 2 --oversubscribe true
check mpiexec-attnrun-ring timeout 120 mpiexec -np 2 --oversubscribe --timeout 100 --bind-to none \
  "$B/build/launch/attnrun" --mode ring --seq 4K --heads 2 --head-dim 64 --check 4 --backend cpu
check mpiexec-attnrun-tp timeout 120 mpiexec -np 2 --oversubscribe --timeout 100 \
  "$B/build/launch/attnrun" --mode tp --seq 1K --heads 4 --head-dim 64 --check 4 --backend cpu
check test_cuda_attn-exits-77 bash -c "'$B/build/tests/gpu/test_cuda_attn' quick; test \$? = 77"
gpu_all_skipped() {
  local out
  out=$(timeout 300 ctest --test-dir "$B/build" -L gpu --output-on-failure --timeout 120 2>&1)
  echo "$out"
  echo "$out" | grep -q '100% tests passed' && ! echo "$out" | grep -qE '\*\*\*(Failed|Timeout|Exception)|Not Run|\(Failed\)'
}
check ctest-gpu-all-skipped gpu_all_skipped
check ctest-spills timeout 120 ctest --test-dir "$B/build" -R cuda_ptxas_spills --output-on-failure
check ctest-mpi-some timeout 900 ctest --test-dir "$B/build" --output-on-failure --timeout 300 \
  -R '^(mpi_comm_np2|mpi_comm_np4|ring_basic_np2|mpi_comm_timeout_allreduce_np2|mpi_comm_fault_kill_np3|layer_ref_tp2_cp1|mpi_cli_check_tp_np2|mpi_cli_bad_flag_np3)$'
echo "chroot checks: $PASS passed, $FAIL failed"
[ $FAIL = 0 ]
EOF
cat >"$FS/tmp/inside-fallback.sh" <<'EOF'
# /tmp/inside-fallback.sh (written by tests/gpu/bundle-chroot-check.sh): device-check.sh's build path.
set -u -o pipefail
R=$1
rm -rf /tmp/dc-out "$R/build-gpu" && mkdir -p /tmp/dc-out
OUT=/tmp/dc-out ATTN_CHECK_BUNDLE=off ATTN_CHECK_ARCH=90a ATTN_CHECK_JOBS=2 ATTN_CHECK_BUDGET_S=1100 \
  timeout 1200 bash "$R/tests/gpu/device-check.sh" >/tmp/dc-out/stdout.txt 2>&1
echo "device-check.sh exit $?"
sed -n '1,20p' /tmp/dc-out/summary.md
echo "NCCL in the device build: $(grep '^NCCL_LIBRARY:' "$R/build-gpu/CMakeCache.txt")"
echo "MPI in the device build: $(grep '^MPI_mpi_LIBRARY:' "$R/build-gpu/CMakeCache.txt")"
grep -q 'mode: device build (the bundle' /tmp/dc-out/summary.md && grep -q '| build | ok' /tmp/dc-out/summary.md &&
  grep -q '| tests | ok' /tmp/dc-out/summary.md && grep -q 'dist-packages/nvidia/nccl' "$R/build-gpu/CMakeCache.txt"
EOF
if [ "$FALLBACK" = 1 ]; then
  chroot "$FS" /bin/bash /tmp/inside-fallback.sh "$INNER"
else
  chroot "$FS" /bin/bash /tmp/inside.sh "$INNER" "$CARRY"
fi
rc=$?
rm -rf "$RESULTS" && mkdir -p "$RESULTS" && cp -a "$FS"/tmp/check-*.log "$FS/tmp/dc-out" "$RESULTS/" 2>/dev/null
echo "logs: $RESULTS (device-check.sh output: $RESULTS/dc-out/summary.md)"
exit $rc
