# tests/gpu/bundle-env.sh — shell functions shared by tests/gpu/bundle.sh (which builds the
# GPU bundle here) and tests/gpu/device-check.sh and the bundle's mpiexec (which use it on a
# bare GPU machine): where things live in a bundle, the environment that makes its relocated
# Open MPI / PMIx / hwloc / BLAS resolve, and the CMake arguments that build the project
# against a staged Debian root instead of the machine's own /usr. Sourced, never run.
#
# A bundle (.gpu-bundle/ in the repository, ignored by git) holds:
#   manifest.txt      what was built from what, by whom, where (absolute paths of that machine)
#   sources.sha256    checksums of the tracked files it was built from (no git needed to compare)
#   sysroot/          the staged Debian packages: usr/lib/x86_64-linux-gnu/{openmpi,pmix2,blas},
#                     usr/bin/{orterun,orted,ompi_info,pkgconf}, usr/share/{openmpi,pmix2}, etc/openmpi
#   fallback/         libraries every real image has (libgomp, libz, libudev, ...): used only for
#                     the sonames the machine itself cannot resolve (see attn_bundle_env)
#   bin/mpiexec       wrapper: environment + MCA defaults, then the bundled orterun
#   bin/pkg-config    wrapper around the bundled pkgconf (for a fallback build on the device)
#   build/            the pruned build tree: executables, CTest files, ptxas logs, the .cu.o the SASS census reads
# It travels to the GPU machine as .gpu-bundle.tar.gz (the 64 MiB carry limit counts raw
# bytes: the folder is about 50 MiB, the tarball about 16): the device tool's run with
#   carry: [".gpu-bundle.tar.gz"], command: "bash tests/gpu/device-check.sh", timeout_s: 560
# and device-check.sh unpacks it there (attn_bundle_unpack) before anything else.

ATTN_MULTIARCH=x86_64-linux-gnu

# attn_sysroot_libdirs SYSROOT — the library folders of a staged root, in search order.
attn_sysroot_libdirs() {
  local s=$1 m=$ATTN_MULTIARCH
  echo "$s/usr/lib/$m $s/usr/lib/$m/openmpi/lib $s/usr/lib/$m/pmix2/lib $s/usr/lib/$m/blas $s/lib/$m"
}

# attn_sysroot_cmake_args SYSROOT PKG_CONFIG — one argument per line: build against the MPI,
# hwloc and (reference) BLAS of a staged root. The indirect libraries (libopen-rte, libpmix,
# libevent, ...) are not on the linker's path by default, hence -rpath-link; -isystem puts
# the staged cblas.h (reference CBLAS, matching libblas.so.3) before any the machine has.
attn_sysroot_cmake_args() {
  local s=$1 pc=$2 l="$1/usr/lib/$ATTN_MULTIARCH" d rl=""
  for d in $(attn_sysroot_libdirs "$s"); do rl="$rl${rl:+:}$d"; done
  printf '%s\n' "-DMPI_SKIP_COMPILER_WRAPPER=ON" "-DMPI_C_HEADER_DIR=$l/openmpi/include" \
    "-DMPI_C_LIB_NAMES=mpi" "-DMPI_mpi_LIBRARY=$l/openmpi/lib/libmpi.so" \
    "-DPKG_CONFIG_EXECUTABLE=$pc" "-DBLA_VENDOR=Generic" "-DBLAS_LIBRARIES=$l/blas/libblas.so" \
    "-DCMAKE_C_FLAGS=-isystem $s/usr/include/$ATTN_MULTIARCH" \
    "-DCMAKE_EXE_LINKER_FLAGS=-Wl,-rpath-link,$rl" "-DCMAKE_SHARED_LINKER_FLAGS=-Wl,-rpath-link,$rl"
}

# attn_sysroot_pkgconfig_env SYSROOT — exports what makes pkg-config read only the staged
# root's .pc files and prefix their paths with it.
attn_sysroot_pkgconfig_env() {
  export PKG_CONFIG_LIBDIR="$1/usr/lib/$ATTN_MULTIARCH/pkgconfig:$1/usr/share/pkgconfig"
  export PKG_CONFIG_SYSROOT_DIR="$1" PKG_CONFIG_ALLOW_SYSTEM_CFLAGS=1 PKG_CONFIG_ALLOW_SYSTEM_LIBS=1
  unset PKG_CONFIG_PATH
}

# attn_system_has SONAME — whether this machine's loader resolves SONAME without our help
# (the loader's cache, read once: a `ldconfig -p | grep -q` pipe fails under pipefail).
attn_system_has() {
  if [ -z "${ATTN_LDCACHE:-}" ]; then
    ATTN_LDCACHE=$("$(command -v ldconfig || echo /sbin/ldconfig)" -p 2>/dev/null)
  fi
  grep -qF "$(printf "\t")$1 (libc6,x86-64" <<<"$ATTN_LDCACHE"
}

# attn_cuda_libdirs — folders on this machine holding libcudart/libnccl/libcublas(Lt) (what
# our programs need: libattnrun links cuBLAS for the TP layer's projections): the CUDA
# toolkit's, then those of python's nvidia-* pip packages (torch's CUDA runtime and cuBLAS,
# nvidia-nccl-cu13).
attn_cuda_libdirs() {
  local d nv py
  {
    for d in ${CUDA_HOME:+$CUDA_HOME/lib64} /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
      [ -d "$d" ] && readlink -f "$d"
    done
    py=$(command -v python3 || true)
    if [ -n "$py" ]; then
      for nv in $(timeout 30 "$py" -c 'import nvidia; print(" ".join(nvidia.__path__))' 2>/dev/null); do
        find "$nv" -maxdepth 3 \( -name 'libnccl.so*' -o -name 'libcudart.so*' -o -name 'libcublas.so*' \
          -o -name 'libcublasLt.so*' \) \
          -printf '%h\n' 2>/dev/null
      done
    fi
  } | awk '!seen[$0]++'
}

# attn_bundle_env BUNDLE — exports the environment that runs the bundle's programs on this
# machine: LD_LIBRARY_PATH (the bundle's libraries, then the fallback sonames this machine
# lacks, then its CUDA libraries), OPAL_PREFIX and friends (Debian's Open MPI 4.1 re-bases
# its install dirs on OPAL_PREFIX; its sysconfdir /etc/openmpi is outside the prefix, hence
# OPAL_SYSCONFDIR), PMIX_PREFIX (PMIx 4 has install dirs of its own under pmix2/), and
# ATTN_BUNDLE; the caller's LD_LIBRARY_PATH is kept in ATTN_ORIG_LD_LIBRARY_PATH for programs
# that must not see ours (PyTorch resolves its own CUDA libraries). Run once per job: children
# inherit it (the mpiexec wrapper checks ATTN_BUNDLE).
attn_bundle_env() {
  local b=$1 s="$1/sysroot" m=$ATTN_MULTIARCH lp="" d f so fb
  for d in $(attn_sysroot_libdirs "$s"); do [ -d "$d" ] && lp="$lp${lp:+:}$d"; done
  # Fallback sonames: symlinked into a folder of their own, rebuilt each time, so that a
  # library the machine has (a newer libstdc++, libgomp, libz) is never shadowed by ours.
  fb="$b/fallback-active"
  rm -rf "$fb.new" && mkdir -p "$fb.new" || return 1
  for f in "$b"/fallback/*.so*; do
    [ -e "$f" ] || continue
    so=$(basename "$f")
    attn_system_has "$so" || ln -s "../fallback/$so" "$fb.new/$so"
  done
  rm -rf "$fb" && mv "$fb.new" "$fb"
  lp="$lp:$fb"
  for d in $(attn_cuda_libdirs); do lp="$lp:$d"; done
  export ATTN_ORIG_LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}"
  export LD_LIBRARY_PATH="$lp${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export OPAL_PREFIX="$s/usr" OPAL_SYSCONFDIR="$s/etc/openmpi" PMIX_PREFIX="$s/usr/lib/$m/pmix2"
  export PATH="$b/bin:$PATH" ATTN_BUNDLE="$b"
}

# attn_bundle_fallback_list BUNDLE — the fallback sonames the current environment uses.
attn_bundle_fallback_list() {
  local f out=""
  for f in "$1"/fallback-active/*; do [ -e "$f" ] && out="$out ${f##*/}"; done
  echo "${out:- none}"
}

# attn_bundle_unpack TARBALL DIR — unpacks a bundle tarball (tests/gpu/bundle.sh writes it:
# one top folder, .gpu-bundle/) into DIR/.gpu-bundle, replacing what is there only once the
# whole tarball has unpacked (into DIR/.gpu-bundle.unpack first). With tar + gzip; when either
# is missing or tar fails, with python3's tarfile. Writes "<sha256 of the tarball> <tool>" to
# DIR/.gpu-bundle/.unpacked-from (how device-check.sh tells an unpacked folder from a carried
# one) and prints the tool used.
attn_bundle_unpack() {
  local tb=$1 dir=$2 tmp="$2/.gpu-bundle.unpack" tool="" sum
  [ -f "$tb" ] || { echo "attn_bundle_unpack: no $tb" >&2; return 1; }
  rm -rf "$tmp" && mkdir -p "$tmp" || return 1
  if command -v tar >/dev/null && command -v gzip >/dev/null; then
    if tar -xzf "$tb" -C "$tmp"; then tool=tar; else echo "attn_bundle_unpack: tar -xzf failed" >&2; fi
  fi
  if [ -z "$tool" ]; then
    rm -rf "$tmp" && mkdir -p "$tmp" || return 1
    python3 - "$tb" "$tmp" <<'PYEOF' && tool=python3-tarfile
import sys, tarfile
# filter="tar" (Python 3.12+, backported to 3.8.17+): keep modes and symlinks, refuse paths
# outside the folder; without it Python 3.14 would default to the stricter "data" filter.
kw = {"filter": "tar"} if hasattr(tarfile, "tar_filter") else {}
with tarfile.open(sys.argv[1], "r:gz") as t:
    t.extractall(sys.argv[2], **kw)
PYEOF
  fi
  if [ -z "$tool" ] || [ ! -f "$tmp/.gpu-bundle/manifest.txt" ]; then
    echo "attn_bundle_unpack: could not unpack $tb${tool:+ (no .gpu-bundle/manifest.txt in it)}" >&2
    rm -rf "$tmp"
    return 1
  fi
  sum=$(sha256sum "$tb" | cut -d' ' -f1)
  echo "$sum $tool" >"$tmp/.gpu-bundle/.unpacked-from"
  rm -rf "$dir/.gpu-bundle" && mv "$tmp/.gpu-bundle" "$dir/.gpu-bundle" && rmdir "$tmp" || return 1
  echo "$tool"
}
