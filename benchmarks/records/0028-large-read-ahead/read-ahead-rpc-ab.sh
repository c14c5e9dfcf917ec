#!/bin/sh
# Issue 65 item 2, no regression: the commit before the read ahead (c70e550, /tmp/basepkgC)
# and this tree, alternated twice in one boot: RPC results into new buffers (rpc_fetch, read
# ahead on the client) and into registered memory (rpc_bw, the shared read window only),
# payloads to a server (rpc_sink), and msg_bw, at 1 MiB, TCP beside each.
# Run as: aiordma lab -- sh benchmarks/records/0028-large-read-ahead/read-ahead-rpc-ab.sh
B="bench --loop uvloop"
for round in 1 2; do
  for side in before after; do
    if [ $side = before ]; then P=/tmp/basepkgC; else P=; fi
    echo "== round $round: $side"
    (cd /tmp && PYTHONPATH=$P /work/main/.venv/bin/python -m aiordma $B rpc_fetch rpc_bw rpc_sink msg_bw --sizes 1048576 --duration 4 --compare tcp 2>&1 | grep "/s\|rror")
  done
done
