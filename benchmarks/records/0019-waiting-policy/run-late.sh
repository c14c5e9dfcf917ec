#!/bin/sh
# Issue 63, the limit that grows on late answers: auto against off, one boot.
cd /work/main
B=".venv/bin/aiordma bench --loop uvloop --sizes 64 --warmup 50"
for r in 1 2; do
  for p in off auto auto:2000; do
    echo "=== back to back, round $r, AIORDMA_POLL=$p"
    AIORDMA_POLL=$p $B send_lat msg_lat rpc_lat --iterations 400 2>&1 | grep "us "
  done
  echo "=== back to back, round $r, TCP (aiordma off beside it)"
  AIORDMA_POLL=off $B send_lat msg_lat rpc_lat --iterations 400 --compare tcp 2>&1 | grep "us "
done
for p in off auto; do
  echo "=== paced 10ms, AIORDMA_POLL=$p"
  AIORDMA_POLL=$p $B send_lat msg_lat --pace 10ms --iterations 150 --warmup 20 --compare tcp 2>&1 | grep "us "
done
for p in off auto; do
  echo "=== one-sided, AIORDMA_POLL=$p"
  AIORDMA_POLL=$p $B write_lat read_lat --iterations 400 2>&1 | grep "us "
  AIORDMA_POLL=$p .venv/bin/aiordma bench --loop uvloop xfer_read xfer_write --sizes 65536 --iterations 200 2>&1 | grep "MB/s"
done
echo "=== perftest references"
$B send_lat --iterations 400 --compare perftest 2>&1 | grep "us "
echo "=== idle"
.venv/bin/python -m benchmarks idle_cost --polling off,auto --seconds 10
