#!/bin/sh
# Issue 65 item 3: the commit before BATCH (240b54a, its wheel in /tmp/basepkgS) and this
# tree, alternated twice in one boot; perftest and TCP beside each rate, TCP beside 64 B latency.
# Run as: aiordma lab -- sh benchmarks/records/0027-small-messages-together/batch-ab.sh
B="bench --loop uvloop"
for round in 1 2; do
  for side in before after; do
    if [ $side = before ]; then P=/tmp/basepkgS; else P=; fi
    echo "== round $round: $side"
    (cd /tmp && PYTHONPATH=$P /work/main/.venv/bin/python -m aiordma $B msg_rate send_rate --sizes 64 --duration 3 --compare perftest --compare tcp 2>&1 | grep "/s\|rror")
    (cd /tmp && PYTHONPATH=$P /work/main/.venv/bin/python -m aiordma $B msg_lat rpc_lat --sizes 64 --iterations 300 --warmup 20 --compare tcp 2>&1 | grep "us \|rror")
    (cd /tmp && PYTHONPATH=$P /work/main/.venv/bin/python -m aiordma $B msg_bw --sizes 65536 --duration 3 --compare tcp 2>&1 | grep "MB/s\|rror")
  done
done
