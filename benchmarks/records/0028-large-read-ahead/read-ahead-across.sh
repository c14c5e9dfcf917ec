#!/bin/sh
# Issue 65 item 2 across the two-host lab's link: the commit before the read ahead
# (c70e550, unpacked in /tmp/basepkgC: run from there, both hosts import it) and this tree,
# alternated twice; perftest beside each.
# Run as: aiordma lab --hosts 2 -- sh benchmarks/records/0028-large-read-ahead/read-ahead-across.sh
PY=/work/main/.venv/bin/python
for round in ${ROUNDS:-1 2}; do
  for side in before after; do
    if [ $side = before ]; then D=/tmp/basepkgC; else D=/tmp; fi
    echo "== round $round: $side"
    (cd $D && $PY -m aiordma bench --loop uvloop --remote msg_bw rpc_fetch --sizes 1048576 --duration 5 --compare perftest 2>&1 | grep "/s\|rror")
  done
done
