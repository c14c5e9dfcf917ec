#!/bin/sh
# Issue 65: Python calls per 64 KiB message on each side (stream_calls.py) with take_medium
# (T, its wheel in /tmp/basepkgT) and with the receive trims and the sender's one chain per
# grant of credit (this tree); then the two alternated three times, perftest and TCP beside.
cd /tmp
for side in T after; do
  if [ $side = T ]; then P=/tmp/basepkgT; else P=; fi
  echo "== calls: $side"
  PYTHONPATH=$P SECONDS=3 /work/main/.venv/bin/python /work/main/benchmarks/records/0026-medium-taken-whole/stream_calls.py 2>&1 | grep "receiver:\|sender:\|MB/s"
done
B="bench --loop uvloop --warmup 20"
for round in 1 2 3; do
  for side in T after; do
    if [ $side = T ]; then P=/tmp/basepkgT; else P=; fi
    echo "== round $round: $side"
    PYTHONPATH=$P /work/main/.venv/bin/python -m aiordma $B msg_into_bw msg_bw --sizes 65536 --iterations 400 --compare perftest --compare tcp 2>&1 | grep "MB/s"
    PYTHONPATH=$P /work/main/.venv/bin/python -m aiordma $B msg_rate --sizes 64 --iterations 4000 --compare perftest 2>&1 | grep "msg/s\|ops/s"
  done
done
