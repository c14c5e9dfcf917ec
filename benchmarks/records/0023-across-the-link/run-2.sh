#!/bin/sh
# Issue 64, a second two-host boot: the timers at 12 and 14 again, in both orders, then the
# 64 B latencies across the link with perftest and TCP beside (each row's link counters).
#   aiordma lab --hosts 2 -- sh benchmarks/records/0023-across-the-link/run-2.sh
cd /work/main || exit 1
P=.venv/bin/python
T=benchmarks/records/0023-across-the-link/timers.py
echo "=== timers, round 1"
$P $T --timeouts 12 14 --losses none 1% 5% --calls 100
echo "=== timers, round 2 (reversed)"
$P $T --timeouts 14 12 --losses 5% 1% none --calls 100
echo "=== 64 B latencies across the link"
.venv/bin/aiordma bench --remote --loop uvloop send_lat write_lat read_lat msg_lat rpc_lat \
    --iterations 300 --compare perftest --compare tcp
