#!/bin/sh
# before (b751665) and after, alternated; perftest from each run
for round in 1 2; do
  echo "=== before, round $round"
  (cd /work/base && PYTHONPATH=/work/base /work/main/.venv/bin/python -m aiordma.cli bench msg_bw --sizes 65536,1048576 --compare perftest)
  (cd /work/base && PYTHONPATH=/work/base /work/main/.venv/bin/python -m aiordma.cli bench msg_lat --sizes 65536 --compare perftest)
  echo "=== after, round $round"
  (cd /work/main && .venv/bin/aiordma bench msg_bw --sizes 65536,1048576 --compare perftest)
  (cd /work/main && .venv/bin/aiordma bench msg_lat --sizes 65536 --compare perftest)
done
