#!/bin/sh
# Issue 65: the device tests, then main before (its wheel on PYTHONPATH) and take_medium after,
# alternated twice in one boot, perftest and TCP beside each run. (In the boot recorded the
# pytest line named a missing path and ran nothing; the device tests ran in the next boot.)
cd /work/main
.venv/bin/python -m pytest -q -p no:cacheprovider -m "rdma and not two_hosts" tests/channel/test_channel.py tests/channel/test_packets.py tests/streams 2>&1 | tail -2
B="bench --loop uvloop --warmup 20"
for round in 1 2; do
  for side in before after; do
    if [ $side = before ]; then P=/tmp/basepkgM; else P=; fi
    echo "== round $round: $side"
    (cd /tmp && PYTHONPATH=$P /work/main/.venv/bin/python -m aiordma $B msg_into_bw msg_bw --sizes 65536 --iterations 400 --compare perftest --compare tcp 2>&1 | grep "MB/s")
    (cd /tmp && PYTHONPATH=$P /work/main/.venv/bin/python -m aiordma $B msg_lat --sizes 65536 --iterations 200 2>&1 | grep "us ")
  done
done
