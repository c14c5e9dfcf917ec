#!/bin/sh
# Issue 63: which cap the growing limit needs on this machine, alternated with off and TCP.
cd /work/main
B=".venv/bin/aiordma bench --loop uvloop --sizes 64 --warmup 50"
for r in 1 2 3; do
  for p in off auto:2000 auto:5000; do
    echo "=== back to back, round $r, AIORDMA_POLL=$p"
    AIORDMA_POLL=$p $B send_lat msg_lat rpc_lat --iterations 400 2>&1 | grep "us "
  done
  echo "=== back to back, round $r, off and TCP"
  $B send_lat msg_lat rpc_lat --iterations 400 --compare tcp 2>&1 | grep "us "
done
for p in off auto:5000; do
  echo "=== paced 10ms, AIORDMA_POLL=$p"
  AIORDMA_POLL=$p $B send_lat msg_lat --pace 10ms --iterations 150 --warmup 20 2>&1 | grep "us "
done
