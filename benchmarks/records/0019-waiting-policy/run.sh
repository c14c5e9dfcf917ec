#!/bin/sh
# Issue 63 measurements in one boot: the waiting policy against off and fixed windows.
cd /work/main
B=".venv/bin/aiordma bench --loop uvloop --sizes 64 --warmup 50"
for r in 1 2; do
  for p in off auto auto:1000 auto:2000 1000; do
    echo "=== back to back, round $r, AIORDMA_POLL=$p"
    AIORDMA_POLL=$p $B send_lat msg_lat rpc_lat --iterations 500 2>&1 | grep "us "
  done
  echo "=== back to back, round $r, references (off) and TCP"
  AIORDMA_POLL=off $B send_lat msg_lat rpc_lat --iterations 500 --compare tcp 2>&1 | grep "us "
done
for pace in 1ms 10ms; do
  for p in off auto auto:1000; do
    echo "=== paced $pace, AIORDMA_POLL=$p"
    AIORDMA_POLL=$p $B send_lat msg_lat --pace $pace --iterations 200 --warmup 20 --compare tcp 2>&1 | grep "us "
  done
done
for p in off auto auto:1000; do
  echo "=== one-sided, AIORDMA_POLL=$p"
  AIORDMA_POLL=$p $B write_lat read_lat --iterations 500 2>&1 | grep "us "
  AIORDMA_POLL=$p .venv/bin/aiordma bench --loop uvloop xfer_read --sizes 65536 --iterations 200 2>&1 | grep "MB/s"
done
echo "=== perftest references"
$B send_lat --iterations 500 --compare perftest 2>&1 | grep "us "
echo "=== idle"
.venv/bin/python -m benchmarks idle_cost --polling off,auto,auto:1000 --seconds 10
