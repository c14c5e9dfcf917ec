#!/bin/sh
# Issue 65 before (0090ea1, /tmp/basepkg65) and after, four rounds alternated in one quiet
# boot: msg_bw and msg_into_bw at 64 KiB with perftest beside, and rpc_bw at 1 MiB, the rows
# issue-65-ab.sh left in doubt.
# Run as: aiordma lab -- sh benchmarks/records/0022-stream-cost/issue-65-64k-ab.sh
PY=/work/main/.venv/bin/python
B="-m aiordma bench --loop uvloop"
cd /tmp
for round in 1 2 3 4; do
  for side in before after; do
    if [ $side = before ]; then P=/tmp/basepkg65; else P=; fi
    echo "== round $round: $side"
    PYTHONPATH=$P $PY $B msg_bw msg_into_bw --sizes 65536 --duration 4 --compare perftest 2>&1 | grep "MB/s\|rror"
    PYTHONPATH=$P $PY $B rpc_bw --sizes 1048576 --duration 3 2>&1 | grep "MB/s\|rror"
  done
done
