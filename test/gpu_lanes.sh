#!/bin/bash
# Runs GPU test lists side by side on one GPU, each lane a command under its own time limit,
# started a few seconds apart (LANE_GAP). Every test engine and server takes a fixed KV pool
# (testing/), so lanes do not count one another's memory as free; a server that sizes its pool
# from the free memory (the README's `sglang_ddtree.serve`) must run alone.
#
#   OUT=/tmp/lanes test/gpu_lanes.sh \
#     "law|600|python3 -m pytest -v test/srt/test_law_vs_nospec.py --basetemp /tmp/lanes/law" \
#     "faults|600|python3 -m pytest -v test/srt/test_faults_e2e.py --basetemp /tmp/lanes/faults"
#
# Each lane: "name|seconds|command"; its output goes to $OUT/lanes/NAME.log (with rc=), and
# --basetemp keeps the servers' logs of a lane that runs out of time.
set -u
mkdir -p "$OUT/lanes"
for lane in "$@"; do
  IFS='|' read -r name limit args <<<"$lane"
  ( timeout -k 10 "$limit" bash -c "$args" >"$OUT/lanes/$name.log" 2>&1
    echo "rc=$?" >>"$OUT/lanes/$name.log" ) &
  sleep "${LANE_GAP:-8}"
done
wait
for f in "$OUT"/lanes/*.log; do
  echo "=== $f"; grep -E "^(FAILED|ERROR)|passed|failed|rc=" "$f" | tail -8
done
