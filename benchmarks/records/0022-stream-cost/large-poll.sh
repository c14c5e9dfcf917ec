#!/bin/sh
# Record 0022, "What bounds a stream of 1 MiB messages": is the receiver's user time its
# spinning? stream_cpu.py at 1 MiB and msg_bw / msg_reg_bw at 1 MiB with the default waiting
# policy (auto) and with no spinning at all (AIORDMA_POLL=off), alternated twice.
# Run as: aiordma lab -- sh benchmarks/records/0022-stream-cost/large-poll.sh
S=/work/main/benchmarks/records/0022-stream-cost/stream_cpu.py
for i in 1 2; do
  for p in auto off; do
    echo "== $p"
    AIORDMA_POLL=$p SIZE=1048576 /work/main/.venv/bin/python $S
    (cd /tmp && AIORDMA_POLL=$p /work/main/.venv/bin/python -m aiordma bench --loop uvloop msg_bw msg_reg_bw --sizes 1048576 --duration 5 2>&1 | grep "/s\|rror")
  done
done
