#!/bin/sh
cd /work/main
for round in 1 2; do
  echo "=== round $round"
  .venv/bin/aiordma bench msg_rate msg_bw send_rate --sizes 64 --compare perftest
done
