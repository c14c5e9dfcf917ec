#!/bin/sh
# The connection set-up time (rdma_cm connect() until established) before (1e8205e, wheel in
# /tmp/basepkgR) and after the set-up fields copied from lists, alternated three times.
# (send_lat rides along: before this tree, `bench connect` alone started its peer without
# a buffer.) Then `bench connect` alone, this tree.
# Run as: aiordma lab -- sh benchmarks/records/0006-compiled-channel-core/setup-connect-ab.sh
B="bench --loop uvloop"
for round in 1 2 3; do
  for side in before after; do
    if [ $side = before ]; then P=/tmp/basepkgR; else P=; fi
    echo "== round $round: $side"
    (cd /tmp && PYTHONPATH=$P /work/main/.venv/bin/python -m aiordma $B connect send_lat --sizes 64 --iterations 40 --warmup 4 2>&1 | grep "connect \|rror")
  done
done
echo "== connect alone (this tree)"
(cd /tmp && /work/main/.venv/bin/python -m aiordma $B connect --iterations 10 --warmup 1 2>&1 | grep "connect \|rror")
