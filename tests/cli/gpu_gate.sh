#!/bin/sh
# gpu_gate.sh — ctest helper for attnrun tests that depend on whether a CUDA device is
# visible: asks `attnrun --list-devices`, then exits 77 (ctest: skipped, SKIP_RETURN_CODE
# 77) when the test cannot mean what it says here, else runs the rest of its command line.
#   gpu_gate.sh --with    ATTNRUN cmd args...   (GPU tests: skipped without a device)
#   gpu_gate.sh --without ATTNRUN cmd args...   (tests of the no-device paths)
want="$1" attnrun="$2"
shift 2
n=$("$attnrun" --list-devices 2>/dev/null | sed -n 's/^cuda devices: \([0-9][0-9]*\).*/\1/p')
n=${n:-0}
if [ "$want" = --with ] && [ "$n" -eq 0 ]; then
  echo "no CUDA device visible to attnrun: skipped"
  exit 77
fi
if [ "$want" = --without ] && [ "$n" -gt 0 ]; then
  echo "$n CUDA device(s) visible: this test is about machines without one: skipped"
  exit 77
fi
exec "$@"
