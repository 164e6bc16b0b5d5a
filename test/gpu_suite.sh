#!/bin/bash
# One set of the GPU suite's lanes (test/gpu_suite.lanes) on one GPU: its alone-* lanes one
# after another, then the others side by side (test/gpu_lanes.sh); logs, pytest's tmp dirs
# and each check's output under $OUT.
#
#   OUT=/tmp/gpu test/gpu_suite.sh 1      # then, on the same or another GPU: ... 2
set -u
SET=${1:?usage: OUT=DIR test/gpu_suite.sh SET}
: "${OUT:?set OUT to a directory for the logs}"
HERE=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$OUT"
alone=() side=()
while IFS='|' read -r set name seconds args; do
  [[ -z "$set" || "$set" == \#* || "$set" != "$SET" ]] && continue
  lane="$name|$seconds|python3 -m pytest -v -m gpu $args --basetemp $OUT/tmp-$name"
  if [[ "$name" == alone-* ]]; then alone+=("$lane"); else side+=("$lane"); fi
done <"$HERE/gpu_suite.lanes"
(( ${#alone[@]} + ${#side[@]} )) || { echo "no lanes in set $SET" >&2; exit 2; }
for lane in "${alone[@]}"; do OUT="$OUT" "$HERE/gpu_lanes.sh" "$lane"; done
(( ${#side[@]} )) && OUT="$OUT" "$HERE/gpu_lanes.sh" "${side[@]}"
! grep -L "^rc=0$" "$OUT"/lanes/*.log | grep -q .
