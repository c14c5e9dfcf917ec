#!/bin/sh
# Issue 66's last changes (set-up fields copied from lists, the CLI's commands) and issue 65's
# recv_messages: the commit before both (1e8205e, its wheel in /tmp/basepkgR) and this tree,
# alternated twice in one boot; TCP beside the round trips.
# Run as: aiordma lab -- sh benchmarks/records/0006-compiled-channel-core/setup-fields-ab.sh
B="bench --loop uvloop"
for round in 1 2; do
  for side in before after; do
    if [ $side = before ]; then P=/tmp/basepkgR; else P=; fi
    echo "== round $round: $side"
    (cd /tmp && PYTHONPATH=$P /work/main/.venv/bin/python -m aiordma $B send_lat msg_lat rpc_lat --sizes 64 --iterations 500 --warmup 50 --compare tcp 2>&1 | grep "us \|rror")
    (cd /tmp && PYTHONPATH=$P /work/main/.venv/bin/python -m aiordma $B connect --iterations 30 --warmup 3 2>&1 | grep "us \|rror")
    (cd /tmp && PYTHONPATH=$P /work/main/.venv/bin/python -m aiordma $B xfer_read msg_bw --sizes 65536 --duration 3 2>&1 | grep "MB/s\|rror")
  done
done
