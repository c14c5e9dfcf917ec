#!/bin/sh
# Issue 65: the commit before recv_messages (1e8205e, its wheel in /tmp/basepkgR) and this
# tree, alternated twice in one boot; perftest and TCP beside each rate, TCP beside 64 B
# latency; then rate_cpu.py (recv_message and recv_messages, the same run, this tree).
# Run as: aiordma lab -- sh benchmarks/records/0027-small-messages-together/recv-many-ab.sh
B="bench --loop uvloop"
for round in 1 2; do
  for side in before after; do
    if [ $side = before ]; then P=/tmp/basepkgR; else P=; fi
    echo "== round $round: $side"
    (cd /tmp && PYTHONPATH=$P /work/main/.venv/bin/python -m aiordma $B msg_rate --sizes 64 --duration 3 --compare perftest --compare tcp 2>&1 | grep "/s\|rror")
    (cd /tmp && PYTHONPATH=$P /work/main/.venv/bin/python -m aiordma $B msg_rate --sizes 64 --depth 64 --duration 3 2>&1 | grep "/s\|rror")
    (cd /tmp && PYTHONPATH=$P /work/main/.venv/bin/python -m aiordma $B msg_lat rpc_lat --sizes 64 --iterations 300 --warmup 20 --compare tcp 2>&1 | grep "us \|rror")
  done
done
echo "== rate_cpu.py (this tree)"
/work/main/.venv/bin/python /work/main/benchmarks/records/0027-small-messages-together/rate_cpu.py
DEPTH=64 /work/main/.venv/bin/python /work/main/benchmarks/records/0027-small-messages-together/rate_cpu.py
