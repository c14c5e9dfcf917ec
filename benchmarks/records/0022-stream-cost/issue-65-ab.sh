#!/bin/sh
# Issue 65 before and after: the commit before its work began (0090ea1, its wheel unpacked
# in /tmp/basepkg65) and this tree, alternated twice in one quiet boot, each figure beside
# perftest and TCP from the same run; then the no-regression rows (64 B round trips, RPC and
# transfers at 1 MiB) and the Python calls per streamed 64 KiB message (stream_calls.py).
# Run as: aiordma lab -- sh benchmarks/records/0022-stream-cost/issue-65-ab.sh
PY=/work/main/.venv/bin/python
D=/work/main/docs/decisions/0022-stream-cost
B="-m aiordma bench --loop uvloop"
for round in 1 2; do
  for side in before after; do
    if [ $side = before ]; then P=/tmp/basepkg65; else P=; fi
    echo "== round $round: $side"
    cd /tmp
    PYTHONPATH=$P $PY $B msg_bw msg_into_bw --sizes 65536,1048576 --duration 4 --compare perftest --compare tcp 2>&1 | grep "MB/s\|rror"
    PYTHONPATH=$P $PY $B send_rate msg_rate --sizes 64 --duration 3 --compare perftest --compare tcp 2>&1 | grep "/s\|rror"
    PYTHONPATH=$P $PY $B msg_rate --sizes 64 --depth 64 --duration 3 --compare perftest 2>&1 | grep "/s\|rror"
    PYTHONPATH=$P $PY $B msg_lat --sizes 65536 --iterations 100 --compare perftest --compare tcp 2>&1 | grep " us \|rror"
    PYTHONPATH=$P $PY $B send_lat msg_lat rpc_lat --sizes 64 --iterations 300 --compare perftest --compare tcp 2>&1 | grep " us \|rror"
    PYTHONPATH=$P $PY $B rpc_bw xfer_read --sizes 1048576 --duration 3 --compare perftest --compare tcp 2>&1 | grep "MB/s\|rror"
    PYTHONPATH=$P $PY $D/stream_calls.py 2>&1 | grep "calls per message\|MB/s"
  done
done
