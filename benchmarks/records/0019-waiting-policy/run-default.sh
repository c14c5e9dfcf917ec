#!/bin/sh
# Issue 63: the new default (auto, 2 ms cap, a limit that grows) against off, one boot, alternated.
cd /work/main
B=".venv/bin/aiordma bench --loop uvloop --sizes 64 --warmup 50"
for r in 1 2; do
  echo "=== back to back, round $r, default (AIORDMA_POLL unset)"
  env -u AIORDMA_POLL $B send_lat msg_lat rpc_lat --iterations 400 --compare tcp 2>&1 | grep "us "
  echo "=== back to back, round $r, AIORDMA_POLL=off"
  AIORDMA_POLL=off $B send_lat msg_lat rpc_lat --iterations 400 --compare tcp 2>&1 | grep "us "
done
for p in default off; do
  echo "=== as the tutorial writes it (wake_floor), $p"
  if [ $p = default ]; then E="env -u AIORDMA_POLL"; else E="env AIORDMA_POLL=off"; fi
  $E .venv/bin/python -m benchmarks wake_floor --rounds 300 --kinds "tcp uvloop,verbs uvloop,aiordma uvloop,ib_send_lat -e"
done
for p in default off; do
  if [ $p = default ]; then E="env -u AIORDMA_POLL"; else E="env AIORDMA_POLL=off"; fi
  echo "=== paced 10ms and 1ms, $p"
  $E $B send_lat msg_lat --pace 10ms --iterations 120 --warmup 20 --compare tcp 2>&1 | grep "us "
  $E $B msg_lat --pace 1ms --iterations 200 --warmup 20 2>&1 | grep "us "
  echo "=== one-sided and bulk, $p"
  $E $B write_lat read_lat --iterations 400 2>&1 | grep "us "
  $E .venv/bin/aiordma bench --loop uvloop xfer_read xfer_write --sizes 65536 --iterations 200 2>&1 | grep "MB/s"
  $E .venv/bin/aiordma bench --loop uvloop msg_bw --sizes 1048576 --iterations 60 2>&1 | grep "MB/s"
done
echo "=== idle"
env -u AIORDMA_POLL .venv/bin/python -m benchmarks idle_cost --polling off,auto --seconds 10
