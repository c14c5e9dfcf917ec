#!/bin/sh
# Issue 65 item 2: the commit before large messages were read ahead (c70e550, its wheel
# unpacked in /tmp/basepkgC) and this tree, alternated twice in one boot; perftest's
# ib_write_bw and TCP's stream beside each msg_bw run.
# Run as: aiordma lab -- sh benchmarks/records/0028-large-read-ahead/read-ahead-ab.sh
B="bench --loop uvloop"
for round in 1 2; do
  for side in before after; do
    if [ $side = before ]; then P=/tmp/basepkgC; else P=; fi
    echo "== round $round: $side"
    (cd /tmp && PYTHONPATH=$P /work/main/.venv/bin/python -m aiordma $B msg_bw --sizes 524288,1048576 --duration 5 --compare perftest --compare tcp 2>&1 | grep "/s\|rror")
    (cd /tmp && PYTHONPATH=$P /work/main/.venv/bin/python -m aiordma $B msg_bw --sizes 65536 --duration 5 2>&1 | grep "/s\|rror")
  done
done
