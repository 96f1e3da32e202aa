#!/usr/bin/env bash
# .gpu-bundle/bin/mpiexec (tests/gpu/bundle-mpiexec.sh, copied there by tests/gpu/bundle.sh):
# runs the bundle's relocated Open MPI 4.1 launcher (orterun) on a machine without Open MPI.
# Sets the environment (tests/gpu/bundle-env.sh: OPAL_PREFIX, PMIX_PREFIX, LD_LIBRARY_PATH)
# unless the caller already did, and single-node MCA defaults the caller may override:
# shared memory + self only (no UCX, libfabric or verbs: not bundled), no single-copy CMA
# (containers often forbid ptrace, which it needs), the launcher for this node only (no ssh
# on a bare image), a session directory per call. Arguments go to orterun unchanged
# (--oversubscribe, --timeout, -np ...).
set -u -o pipefail
b="$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/.." && pwd)"
if [ "${ATTN_BUNDLE:-}" != "$b" ]; then
  # shellcheck source=bundle-env.sh
  . "$b/bundle-env.sh" || exit 1
  attn_bundle_env "$b" || exit 1
fi
export OMPI_MCA_pml=${OMPI_MCA_pml:-ob1}
export OMPI_MCA_btl=${OMPI_MCA_btl:-self,vader}
export OMPI_MCA_btl_vader_single_copy_mechanism=${OMPI_MCA_btl_vader_single_copy_mechanism:-none}
export OMPI_MCA_plm=${OMPI_MCA_plm:-isolated}
if [ "$(id -u)" = 0 ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=${OMPI_ALLOW_RUN_AS_ROOT:-1}
  export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=${OMPI_ALLOW_RUN_AS_ROOT_CONFIRM:-1}
fi
# A session directory of its own: Open MPI 4.1 creates /tmp/ompi.<host>.<uid> with a
# mkdir that fails with "File exists" when two launchers start at once (ctest -j runs the
# MPI tests side by side; seen in the bundle's chroot check). One empty folder per call is
# left behind on the scratch machine.
if [ -z "${OMPI_MCA_orte_tmpdir_base:-}" ]; then
  OMPI_MCA_orte_tmpdir_base=$(mktemp -d "${TMPDIR:-/tmp}/attn-ompi.XXXXXX") || exit 1
  export OMPI_MCA_orte_tmpdir_base
fi
exec "$b/sysroot/usr/bin/orterun" "$@"
