#!/bin/sh
cd "$(dirname "$0")/../../.."
for round in 1 2; do
for w in 32 64 96; do
  echo "=== window $w round $round"
  WINDOW=$w PYTHONPATH=benchmarks/records/0016-chains/window-site .venv/bin/aiordma bench msg_bw --sizes 65536 $( [ $w = 32 ] && echo --compare perftest ) 2>&1 | grep -v '^\['
done
done
