#!/bin/sh
# Issue 65 item 2 across the two-host lab's link: read_ahead.py with its server on host 2,
# nothing read ahead (the default across a wire) and read_ahead=16 MiB, with and without
# 20 ms of awaited work per message, alternated twice; then this tree's msg_bw and perftest.
# Run as: aiordma lab --hosts 2 -- sh benchmarks/records/0028-large-read-ahead/read-ahead-work-across.sh
S=/work/main/benchmarks/records/0028-large-read-ahead/read_ahead.py
for round in 1 2; do
  echo "== round $round"
  for work in 0 20; do
    (cd /tmp && WORK_MS=$work /work/main/.venv/bin/python $S 2>&1 | grep "MB/s\|rror")
    (cd /tmp && READ_AHEAD=16777216 WORK_MS=$work /work/main/.venv/bin/python $S 2>&1 | grep "MB/s\|rror")
  done
done
