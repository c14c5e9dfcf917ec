#!/bin/sh
# Issue 65 item 2: read_ahead.py as it was at cb369df (it then set the receiver's budget of
# bytes read ahead, 4 MiB by default, from READ_AHEAD) at 0 (none), one,
# two and four 1 MiB messages, with and without 20 ms of awaited work per message.
# Run as: aiordma lab -- sh benchmarks/records/0028-large-read-ahead/read-ahead-budget.sh
S=/work/main/benchmarks/records/0028-large-read-ahead/read_ahead.py
for round in 1 2; do
  echo "== round $round"
  for budget in 0 1048576 2097152 4194304; do
    for work in 0 20; do
      (cd /tmp && READ_AHEAD=$budget WORK_MS=$work /work/main/.venv/bin/python $S 2>&1 | grep "MB/s\|rror")
    done
  done
done
