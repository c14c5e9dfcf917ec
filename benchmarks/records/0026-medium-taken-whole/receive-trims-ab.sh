#!/bin/sh
# Issue 65: the device tests of the receive path, the receiver's Python calls per 64 KiB
# message (stream_calls.py) on main before issue 65 (M), with take_medium (T) and with the
# receive trims (this tree), then T and the trims alternated twice, perftest and TCP beside.
# Wheels of M and T unpacked in /tmp/basepkgM and /tmp/basepkgT.
cd /work/main
.venv/bin/python -m pytest -q -p no:cacheprovider -m "rdma and not two_hosts" tests/channel/test_receiver.py tests/channel/test_channel.py tests/channel/test_packets.py tests/test_streams.py tests/test_metrics.py 2>&1 | tail -2
for side in M T after; do
  case $side in M) P=/tmp/basepkgM;; T) P=/tmp/basepkgT;; after) P=;; esac
  echo "== calls: $side"
  (cd /tmp && PYTHONPATH=$P SECONDS=3 /work/main/.venv/bin/python /work/main/benchmarks/records/0026-medium-taken-whole/stream_calls.py 2>&1 | grep "receiver:\|sender:")
done
B="bench --loop uvloop --warmup 20"
for round in 1 2; do
  for side in T after; do
    if [ $side = T ]; then P=/tmp/basepkgT; else P=; fi
    echo "== round $round: $side"
    (cd /tmp && PYTHONPATH=$P /work/main/.venv/bin/python -m aiordma $B msg_into_bw msg_bw --sizes 65536 --iterations 400 --compare perftest --compare tcp 2>&1 | grep "MB/s")
  done
done
