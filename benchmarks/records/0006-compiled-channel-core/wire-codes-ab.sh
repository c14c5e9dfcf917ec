#!/bin/sh
# Issue 66: the commit before WireCodes and the struct-literal posts (73c1908, its wheel
# in /tmp/basepkgB) and this tree, alternated twice in one boot, TCP beside each run.
B="bench --loop uvloop --warmup 20"
for round in 1 2; do
  for side in before after; do
    if [ $side = before ]; then P=/tmp/basepkgB; else P=; fi
    echo "== round $round: $side"
    (cd /tmp && PYTHONPATH=$P /work/main/.venv/bin/python -c "import aiordma; print(aiordma.__file__, aiordma.info()['per-message path'])" 2>/dev/null)
    (cd /tmp && PYTHONPATH=$P /work/main/.venv/bin/python -m aiordma $B send_lat msg_lat rpc_lat --iterations 400 --compare tcp 2>&1 | grep "us ")
    (cd /tmp && PYTHONPATH=$P /work/main/.venv/bin/python -m aiordma $B msg_bw --sizes 65536 --duration 4 --compare tcp 2>&1 | grep "MB/s\|rror")
    (cd /tmp && PYTHONPATH=$P /work/main/.venv/bin/python -m aiordma $B xfer_read --duration 4 2>&1 | grep "MB/s\|rror")
  done
done
