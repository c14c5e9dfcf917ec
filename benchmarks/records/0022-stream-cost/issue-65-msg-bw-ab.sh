#!/bin/sh
# Issue 65 before (0090ea1, /tmp/basepkg65) and after: msg_bw at 64 KiB only, eight rounds
# alternated in one quiet boot, perftest beside each (is the bench's own 64 KiB stream slower?).
# Run as: aiordma lab -- sh benchmarks/records/0022-stream-cost/issue-65-msg-bw-ab.sh
PY=/work/main/.venv/bin/python
cd /tmp
for round in 1 2 3 4 5 6 7 8; do
  for side in before after; do
    if [ $side = before ]; then P=/tmp/basepkg65; else P=; fi
    echo "== round $round: $side"
    PYTHONPATH=$P $PY -m aiordma bench --loop uvloop msg_bw --sizes 65536 --duration 4 --compare perftest 2>&1 | grep "MB/s\|rror"
  done
done
