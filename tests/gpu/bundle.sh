#!/usr/bin/env bash
# tests/gpu/bundle.sh — run HERE (Debian 12 with nvcc, apt) before a GPU session: builds the
# full project with the CUDA backend for the device (sm_90a, Release) against a staged copy
# of Debian's Open MPI / PMIx / hwloc / reference BLAS, and writes .gpu-bundle/: the pruned
# build tree plus every library a bare CUDA image lacks, an mpiexec wrapper that runs the
# relocated Open MPI, and a manifest; then .gpu-bundle.tar.gz, the same folder gzipped (the
# device tool's 64 MiB carry limit counts raw bytes: the folder is about 50 MiB, the ~40 MB
# kernel fatbin once, in libattnrun, which the GPU tests and benchmark link; the tarball about 16). tests/gpu/device-check.sh
# unpacks it on the GPU machine and runs the tests there without building (README.md, "GPU").
# Then, with the device tool:
#   run(carry: [".gpu-bundle.tar.gz"], command: "bash tests/gpu/device-check.sh", timeout_s: 560)
#
# Not bundled, on purpose: glibc (libc, libm, libdl, libpthread, librt, ld-linux: the device's
# newer one must be used), the CUDA driver (libcuda), libcudart/libcublas/libnccl (our
# executables link cudart statically where they can; the rest come from the device's CUDA
# toolkit or python's nvidia-* packages, found at run time), OpenBLAS (35 MB: the 64 MiB
# carry limit; the bundle links Debian's reference BLAS, libblas.so.3, which the GPU tests
# only touch on tiny CPU projections).
#
# Environment: ATTN_BUNDLE_JOBS (default 2), ATTN_BUNDLE_ARCH (default 90a),
# ATTN_BUNDLE_MAX_MIB (default 56: fail above it; counts the tree the device tool copies plus
# the tarball). Needs apt-get (downloads .debs only; it installs nothing), dpkg-deb, readelf,
# cmake, nvcc, tar, gzip. Writes only .gpu-bundle/, .gpu-bundle.tar.gz and .gpu-bundle-cache/
# (the .debs, the full staged root, the incremental build) in the repo.
set -u -o pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT" || exit 1
# shellcheck source=bundle-env.sh
. "$ROOT/tests/gpu/bundle-env.sh"
JOBS=${ATTN_BUNDLE_JOBS:-2}
ARCH=${ATTN_BUNDLE_ARCH:-90a}
MAX_MIB=${ATTN_BUNDLE_MAX_MIB:-56}
OUTB="$ROOT/.gpu-bundle"
TARBALL="$ROOT/.gpu-bundle.tar.gz"
CACHE="$ROOT/.gpu-bundle-cache"
STAGE="$CACHE/stage"
BUILD="$CACHE/build"
M=$ATTN_MULTIARCH

# Packages staged. Runtime: Open MPI 4.1 (libraries, plugins, orterun/orted, help files,
# mca-params), PMIx 4 and what it links (libevent, munge), hwloc, reference BLAS, the
# toolchain libraries our code links (libgomp, libgfortran); build (headers, .so links,
# .pc files, pkgconf): so the device can rebuild against the same root when it must.
PKGS="libopenmpi3 libopenmpi-dev openmpi-bin openmpi-common libpmix2 libmunge2
  libevent-core-2.1-7 libevent-pthreads-2.1-7 libevent-2.1-7 libhwloc15 libhwloc-dev
  libblas3 libblas-dev libgomp1 libgfortran5 libquadmath0 libudev1 zlib1g libltdl7 libnuma1
  libpciaccess0 libstdc++6 libgcc-s1 pkgconf pkgconf-bin libpkgconf3"
# Libraries any real image already has: bundled, but used only for a soname the device
# cannot resolve (tests/gpu/bundle-env.sh, attn_bundle_env), never in front of its own.
FALLBACK_RE='^(libgomp|libgfortran|libquadmath|libz|libudev|libgcc_s|libstdc\+\+)\.so'
# Provided by the device (glibc; the CUDA driver, runtime and libraries): never bundled.
SYSTEM_RE='^(libc|libm|libmvec|libdl|libpthread|librt|libutil|libresolv|libanl|ld-linux-x86-64|libcuda|libnvidia-ml|libcudart|libcublas|libcublasLt|libnccl)\.so'

die() { echo "bundle.sh: $*" >&2; exit 1; }
say() { echo "== $*"; }

# ---- 1. fetch and stage the packages --------------------------------------------------------
fetch() {
  local p have need=""
  command -v apt-get >/dev/null || die "apt-get not found: the bundle is built from Debian 12 packages"
  mkdir -p "$CACHE/debs"
  for p in $PKGS; do
    have=$(ls "$CACHE/debs/${p}_"*.deb 2>/dev/null | head -1)
    [ -n "$have" ] || need="$need $p"
  done
  if [ -n "$need" ]; then
    say "apt-get download$need"
    (cd "$CACHE/debs" && timeout 600 apt-get download $need) ||
      die "apt-get download failed (run apt-get update first?)"
  fi
  rm -rf "$STAGE" && mkdir -p "$STAGE"
  for p in "$CACHE"/debs/*.deb; do
    timeout 120 dpkg-deb -x "$p" "$STAGE" || die "dpkg-deb -x $p failed"
  done
  # What Debian's alternatives would link for libblas-dev: the .so and cblas.h.
  ln -sfn libblas.so.3 "$STAGE/usr/lib/$M/blas/libblas.so"
  ln -sfn cblas-netlib.h "$STAGE/usr/include/$M/cblas.h"
}

# ---- 2. configure and build -------------------------------------------------------------------
build() {
  local pc args
  pc=$(command -v pkg-config || echo "$STAGE/usr/bin/pkgconf")
  attn_sysroot_pkgconfig_env "$STAGE"
  mapfile -t args < <(attn_sysroot_cmake_args "$STAGE" "$pc")
  say "configure $BUILD (CUDA $ARCH, Release, against $STAGE)"
  # -U: pkg_check_modules keeps an earlier answer (__pkg_config_checked_*); a configure of
  # this tree outside bundle.sh (a plain `cmake --build` that re-ran it) would have found the
  # machine's own OpenBLAS, which the GPU image lacks. Ask the staged root again each time.
  timeout 600 cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DATTN_CUDA=ON \
    -U '__pkg_config_checked_*' -U 'OPENBLAS_*' -U 'pkgcfg_lib_*' \
    "-DCMAKE_CUDA_ARCHITECTURES=$ARCH" -DATTN_CUDA_EMULATOR=OFF -DCMAKE_BUILD_RPATH_USE_ORIGIN=ON \
    "-DMPIEXEC_EXECUTABLE=$OUTB/bin/mpiexec" "${args[@]}" >"$CACHE/configure.log" 2>&1 ||
    { tail -30 "$CACHE/configure.log"; die "configure failed (log: $CACHE/configure.log)"; }
  grep -q "^NCCL_LIBRARY:FILEPATH=.*nccl" "$BUILD/CMakeCache.txt" ||
    echo "bundle.sh: warning: NCCL not found here, test_nccl (cuda_nccl_np*) is not built" >&2
  say "build -j$JOBS (the first build takes a while: every kernel instance for sm_$ARCH)"
  timeout 3600 cmake --build "$BUILD" -j "$JOBS" || die "build failed"
}

# ---- 3. the library closure -------------------------------------------------------------------
needed() { readelf -d "$1" 2>/dev/null | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'; }
# find_staged SONAME — the staged file that provides SONAME (first library folder wins).
find_staged() {
  local d
  for d in $(attn_sysroot_libdirs "$STAGE"); do
    [ -e "$d/$1" ] && { echo "$d/$1"; return 0; }
  done
  return 1
}
# closure ELF... — prints "soname<TAB>staged path" for everything the ELFs need, recursively;
# returns 1 (after printing "MISSING soname") when a soname is neither staged nor the device's.
closure() {
  local -A seen=()
  local queue=("$@") f so p bad=0
  while ((${#queue[@]})); do
    f=${queue[0]} queue=("${queue[@]:1}")
    for so in $(needed "$f"); do
      [[ -n ${seen[$so]:-} ]] && continue
      seen[$so]=1
      [[ $so =~ $SYSTEM_RE ]] && continue
      [ -n "$(find "$NEW/build" -name "$so" -print -quit)" ] && continue # ours (libattnrun)
      if p=$(find_staged "$so"); then
        printf '%s\t%s\n' "$so" "$p"
        queue+=("$p")
      else
        echo "MISSING $so (needed by ${f#"$STAGE"/})"
        bad=1
      fi
    done
  done
  return $bad
}

# ---- 4. assemble the bundle ---------------------------------------------------------------------
# copy_staged PATH... — copies staged paths (relative to the stage; globs are expanded there)
# into the bundle's sysroot, keeping symlinks and the layout Open MPI's relocation relies on.
copy_staged() {
  # shellcheck disable=SC2048,SC2086 # word splitting and globbing wanted, in the stage
  (cd "$STAGE" && set -- $* && cp -a --parents "$@" "$NEW/sysroot/") || die "copying $* from the stage failed"
}

# copy_lib SONAME STAGED_PATH — the library and its symlink chain, or into fallback/.
copy_lib() {
  local so=$1 p=$2 real
  real=$(readlink -f "$p")
  if [[ $so =~ $FALLBACK_RE ]]; then
    cp -L "$p" "$NEW/fallback/$so"
  else
    copy_staged "${p#"$STAGE"/}" "${real#"$STAGE"/}"
  fi
}

# The build tree, pruned: what ctest -L gpu and device-check.sh read (its SASS census
# disassembles the objects kept here). CTest files name the
# build folder, which moves from .gpu-bundle-cache/build to .gpu-bundle/build.
export_build() {
  local f rel
  mkdir -p "$NEW/build"
  (cd "$BUILD" && find . \( -name CTestTestfile.cmake -o -name CMakeCache.txt \
    -o -name fwd_hd128_bf16_causal.cu.o -o -name bwd_hd128_bf16.cu.o \
    -o -name fwd_hd128_bf16_causal_sm90.cu.o -o -name bwd_hd128_bf16_sm90.cu.o \
    -o -name bwd_hd128_f16_causal_sm90.cu.o -o -name fwd_hd64_bf16_sm90.cu.o \
    -o -name bwd_hd64_bf16_causal_sm90.cu.o -o -name fwd_hd256_bf16_sm90.cu.o \
    -o -name bwd_hd256_bf16_sm90.cu.o \) -print0 |
    xargs -0 cp -a --parents -t "$NEW/build") || die "copying the build tree failed"
  [ -d "$BUILD/ptxas" ] && cp -a "$BUILD/ptxas" "$NEW/build/"
  # Executables and shared libraries we built (not CMake's own probes under CMakeFiles/).
  while IFS= read -r rel; do
    mkdir -p "$NEW/build/$(dirname "$rel")" && cp -a "$BUILD/$rel" "$NEW/build/$rel"
  done < <(cd "$BUILD" && find . -path '*/CMakeFiles' -prune -o \( -type f -perm -u+x -o -type l \) \
    \( -name '*.so*' -o ! -name '*.*' \) -print | sed 's|^\./||')
  for f in $(grep -rl --include=CTestTestfile.cmake --include=CMakeCache.txt -F "$BUILD" "$NEW/build"); do
    sed -i "s|$BUILD|$OUTB/build|g" "$f"
  done
}

elf_roots() {
  local f
  for f in $(find "$NEW/build" -type f -perm -u+x) "$STAGE"/usr/bin/{orterun,orted,ompi_info,pkgconf}; do
    [ -f "$f" ] && file -b "$f" 2>/dev/null | grep -q '^ELF' && echo "$f"
  done
}

# Plugins whose libraries are not staged (UCX, libfabric, verbs, PSM, CUDA in Open MPI) are
# left out: Open MPI would only warn that it cannot open them. So are OpenSHMEM's (atomic,
# memheap, scoll, spml, sshmem: oshrun only), which need liboshmem. Prints the kept ones.
plugins() {
  local p
  for p in "$STAGE/usr/lib/$M"/openmpi/lib/openmpi3/*.so "$STAGE/usr/lib/$M"/pmix2/lib/pmix/*.so; do
    if [[ ${p##*/} =~ ^mca_(atomic|memheap|scoll|spml|sshmem)_ ]]; then
      echo "${p##*/}" >>"$NEW/plugins-left-out.txt"
    elif closure "$p" >/dev/null; then echo "${p#"$STAGE"/}"; else echo "${p##*/}" >>"$NEW/plugins-left-out.txt"; fi
  done
}

assemble() {
  local so p kept lines
  NEW="$OUTB.new"
  rm -rf "$NEW" && mkdir -p "$NEW/sysroot" "$NEW/fallback" "$NEW/bin" || die "cannot write $NEW"
  export_build
  say "plugins"
  mapfile -t kept < <(plugins)
  copy_staged "${kept[@]}"
  say "library closure of the build and the Open MPI programs and plugins"
  lines=$(closure $(elf_roots) "${kept[@]/#/$STAGE/}") || { echo "$lines" | grep MISSING; die "unresolved libraries"; }
  while IFS=$'\t' read -r so p; do copy_lib "$so" "$p"; done <<<"$(echo "$lines" | sort -u)"
  echo "$lines" | sort -u | awk -F'\t' '{print $1}' >"$NEW/libraries.txt"
  # Programs, help texts, mca-params.conf, headers, .pc files and -dev links (device fallback build).
  copy_staged usr/bin/orterun usr/bin/orted usr/bin/ompi_info usr/bin/pkgconf usr/share/openmpi \
    "usr/lib/$M/pmix2/share" etc/openmpi "usr/lib/$M/openmpi/lib/libmpi.so" \
    "usr/lib/$M"/openmpi/include/*.h "usr/lib/$M/openmpi/include/openmpi/mpiext" \
    "usr/lib/$M/openmpi/include/openmpi/ompi/mpi/cxx" \
    "usr/lib/$M/pkgconfig" usr/include/hwloc.h usr/include/hwloc "usr/lib/$M/libhwloc.so" \
    "usr/lib/$M/blas/libblas.so" "usr/include/$M"/cblas*.h "usr/include/$M/hwloc"
  write_wrappers
  write_manifest
  # The old tarball goes with the old folder: the two never disagree.
  rm -rf "$OUTB" "$TARBALL" && mv "$NEW" "$OUTB" || die "cannot move $NEW to $OUTB"
}

# ---- 5. the tarball that travels --------------------------------------------------------------
# Paths start with .gpu-bundle/ (unpacked at the repository root); owner root, names sorted,
# no gzip timestamp. Written beside and moved into place once gzip -t and a listing pass.
write_tarball() {
  local new="$TARBALL.new"
  say "tarball $TARBALL"
  rm -f "$new"
  (cd "$ROOT" && tar --sort=name --owner=0 --group=0 --numeric-owner -cf - .gpu-bundle) |
    gzip -n -9 >"$new" || { rm -f "$new"; die "writing $new failed"; }
  gzip -t "$new" && tar -tzf "$new" | grep -x '\.gpu-bundle/manifest\.txt' >/dev/null ||
    { rm -f "$new"; die "$new does not read back"; }
  mv "$new" "$TARBALL" || die "cannot move $new to $TARBALL"
}

write_wrappers() {
  cp "$ROOT/tests/gpu/bundle-mpiexec.sh" "$NEW/bin/mpiexec"
  cp "$ROOT/tests/gpu/bundle-env.sh" "$NEW/bundle-env.sh"
  ln -s mpiexec "$NEW/bin/mpirun"
  cat >"$NEW/bin/pkg-config" <<'EOF'
#!/usr/bin/env bash
# .gpu-bundle/bin/pkg-config (written by tests/gpu/bundle.sh): the bundled pkgconf, for a build on the device.
b="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
LD_LIBRARY_PATH="$b/sysroot/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" exec "$b/sysroot/usr/bin/pkgconf" "$@"
EOF
  chmod +x "$NEW/bin/mpiexec" "$NEW/bin/pkg-config"
}

# The sonames the bundle leaves to the device: glibc's and CUDA's, across everything bundled.
device_sonames() {
  local f
  for f in $(find "$NEW/build" "$NEW/sysroot" "$NEW/fallback" -type f -name '*.so*' -o -type f -perm -u+x); do
    needed "$f" | grep -E "$SYSTEM_RE"
  done | sort -u
}

nccl_version() {
  local h
  h="$(sed -n 's/^NCCL_INCLUDE_DIR:PATH=//p' "$BUILD/CMakeCache.txt")/nccl.h"
  [ -f "$h" ] && sed -n 's/^#define NCCL_\(MAJOR\|MINOR\|PATCH\) *\([0-9]*\).*/\2/p' "$h" | paste -sd.
}

write_manifest() {
  local p
  (cd "$ROOT" && git ls-files -z | xargs -0 sha256sum) >"$NEW/sources.sha256" || die "checksums failed"
  {
    echo "# .gpu-bundle/manifest.txt — written by tests/gpu/bundle.sh; read by tests/gpu/device-check.sh"
    echo "git_sha=$(git -C "$ROOT" rev-parse HEAD 2>/dev/null || echo unknown)"
    echo "git_dirty=$(git -C "$ROOT" status --porcelain --untracked-files=no 2>/dev/null | wc -l)"
    echo "built_utc=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "source_dir=$ROOT"
    echo "build_dir=$OUTB/build"
    echo "bundle_dir=$OUTB"
    echo "cuda_arch=$ARCH"
    echo "nvcc=$(nvcc --version 2>/dev/null | sed -n 's/.*release \([0-9.]*\).*/\1/p')"
    echo "host=$(. /etc/os-release && echo "$PRETTY_NAME"), glibc $(ldd --version | head -1 | awk '{print $NF}')"
    echo "cmake=$(cmake --version | head -1 | awk '{print $3}')"
    echo "nccl_at_build=$(sed -n 's/^NCCL_LIBRARY:FILEPATH=//p' "$BUILD/CMakeCache.txt") $(nccl_version)"
    echo "blas=reference (Debian libblas3), not OpenBLAS"
    echo "device_provides=$(device_sonames | tr '\n' ' ')"
    echo
    echo "# packages (name version)"
    for p in "$CACHE"/debs/*.deb; do echo "pkg $(dpkg-deb -f "$p" Package) $(dpkg-deb -f "$p" Version)"; done
    echo
    echo "# what the built programs need from the device (NEEDED sonames outside the bundle)"
    for p in $(find "$NEW/build" -type f -perm -u+x); do
      file -b "$p" | grep -q '^ELF' || continue
      echo "needs ${p#"$NEW"/build/}: $(needed "$p" | grep -E "$SYSTEM_RE" | tr '\n' ' ')"
    done
    echo
    echo "# fallback (used only for sonames the device lacks): $(ls "$NEW/fallback" | tr '\n' ' ')"
    echo "# plugins left out (their libraries are not bundled): $(tr '\n' ' ' <"$NEW/plugins-left-out.txt" 2>/dev/null)"
  } >"$NEW/manifest.txt"
}

# ---- 6. sizes -------------------------------------------------------------------------------------
# What travels: the tree as the device tool copies it (tracked and unignored files) plus the
# tarball. The folder's raw size is shown for comparison only. (Printed, not written into the
# manifest: that is inside the tarball already.)
report_size() {
  local tree bundle tgz
  tree=$(cd "$ROOT" && git ls-files -co --exclude-standard -z | du -cb --files0-from=- | tail -1 | cut -f1)
  bundle=$(du -sb "$OUTB" | cut -f1)
  tgz=$(stat -c %s "$TARBALL")
  du -sh "$OUTB"/* | sort -h
  awk -v t="$tree" -v b="$bundle" -v z="$tgz" -v lim="$MAX_MIB" 'BEGIN { m = 1048576
    printf "sizes: tree %.1f MiB + .gpu-bundle.tar.gz %.1f MiB = %.1f MiB carried (ATTN_BUNDLE_MAX_MIB %d, carry limit 64 MiB); .gpu-bundle/ unpacked %.1f MiB\n", t / m, z / m, (t + z) / m, lim, b / m }'
  ((tree + tgz <= MAX_MIB * 1048576)) || die "over ATTN_BUNDLE_MAX_MIB=$MAX_MIB MiB"
}

fetch
build
assemble
write_tarball
report_size
echo "bundle.sh: $TARBALL ready (git $(git -C "$ROOT" rev-parse --short=12 HEAD 2>/dev/null), sha256 $(sha256sum "$TARBALL" | cut -c1-16))."
echo "  device tool: run(carry: [\".gpu-bundle.tar.gz\"], command: \"bash tests/gpu/device-check.sh\", timeout_s: 560)"
echo "  if its summary says \"Out of budget\", at once (the machine goes back when idle) the same carry with the"
echo "  ATTN_CHECK_ONLY=... command the summary prints, timeout_s within the session's time left"
