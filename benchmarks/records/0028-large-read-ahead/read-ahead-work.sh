#!/bin/sh
# Issue 65 item 2: read_ahead.py (a server that awaits WORK_MS per message) on the commit
# before (c70e550, /tmp/basepkgC) and this tree, alternated twice; then the ceiling on one
# queue pair: perftest's ib_read_bw and ib_write_bw and aiordma's read_bw at 1 MiB.
# Run as: aiordma lab -- sh benchmarks/records/0028-large-read-ahead/read-ahead-work.sh
S=/work/main/benchmarks/records/0028-large-read-ahead/read_ahead.py
for round in 1 2; do
  for side in before after; do
    if [ $side = before ]; then P=/tmp/basepkgC; else P=; fi
    echo "== round $round: $side"
    for work in 0 20; do
      (cd /tmp && PYTHONPATH=$P WORK_MS=$work /work/main/.venv/bin/python $S 2>&1 | grep "MB/s\|rror")
    done
  done
done
echo "== one queue pair, 1 MiB"
(cd /tmp && /work/main/.venv/bin/python -m aiordma bench --loop uvloop read_bw write_bw --sizes 1048576 --duration 5 --compare perftest 2>&1 | grep "/s\|rror")
