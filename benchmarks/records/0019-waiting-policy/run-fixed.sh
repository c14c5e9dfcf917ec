#!/bin/sh
# Issue 63's last comparison: the default (auto) against a fixed 300 us window and off, one boot,
# alternated, with TCP and perftest beside.
cd /work/main
B=".venv/bin/aiordma bench --loop uvloop --sizes 64 --warmup 50"
for r in 1 2; do
  for p in default 300 off; do
    if [ $p = default ]; then E="env -u AIORDMA_POLL"; else E="env AIORDMA_POLL=$p"; fi
    echo "=== back to back, round $r, $p"
    $E $B send_lat msg_lat rpc_lat --iterations 300 --compare tcp 2>&1 | grep "us "
  done
done
for p in default 300 off; do
  if [ $p = default ]; then E="env -u AIORDMA_POLL"; else E="env AIORDMA_POLL=$p"; fi
  echo "=== as the tutorial writes it (wake_floor), $p"
  $E .venv/bin/python -m benchmarks wake_floor --rounds 300 --kinds "tcp uvloop,verbs uvloop,aiordma uvloop,ib_send_lat -e"
done
