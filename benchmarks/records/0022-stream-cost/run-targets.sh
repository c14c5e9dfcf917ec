#!/bin/sh
# Record 0022: issue 65's figures in one boot, each beside its reference from the same boot,
# then the stream's cost per message (stream_cpu.py).
# Run as: aiordma lab -- sh benchmarks/records/0022-stream-cost/run-targets.sh
cd /work/main
B=".venv/bin/aiordma bench"
$B msg_bw msg_into_bw --sizes 65536,1048576 --duration 4 --compare perftest --compare tcp 2>&1 | grep "MB/s"
$B send_rate msg_rate --sizes 64 --duration 3 --compare perftest --compare tcp 2>&1 | grep "/s"
$B msg_lat send_lat --sizes 65536 --iterations 100 --compare perftest --compare tcp 2>&1 | grep " us "
.venv/bin/python benchmarks/records/0022-stream-cost/stream_cpu.py
