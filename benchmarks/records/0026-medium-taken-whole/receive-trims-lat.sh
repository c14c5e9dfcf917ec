#!/bin/sh
# Issue 65: 64 B round trips (and the 64 KiB message round trip) with take_medium (T, its
# wheel in /tmp/basepkgT) and with the receive trims (this tree), alternated twice, TCP beside.
B="bench --loop uvloop --warmup 20"
for round in 1 2; do
  for side in T after; do
    if [ $side = T ]; then P=/tmp/basepkgT; else P=; fi
    echo "== round $round: $side"
    (cd /tmp && PYTHONPATH=$P /work/main/.venv/bin/python -m aiordma $B send_lat msg_lat rpc_lat --iterations 400 --compare tcp 2>&1 | grep "us ")
    (cd /tmp && PYTHONPATH=$P /work/main/.venv/bin/python -m aiordma $B msg_lat --sizes 65536 --iterations 200 --compare tcp 2>&1 | grep "us \|rror")
  done
done
