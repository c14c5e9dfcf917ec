#!/bin/sh
# small-message latency and Python calls: before (b751665) and after, alternated
for round in 1 2; do
  echo "=== before, round $round"
  (cd /work/base && PYTHONPATH=/work/base /work/main/.venv/bin/python -m aiordma.cli bench msg_lat msg_bw --sizes 64 --compare tcp)
  echo "=== after, round $round"
  (cd /work/main && .venv/bin/aiordma bench msg_lat msg_bw --sizes 64 --compare tcp)
done
echo "=== calls before"
(cd /work/base && PYTHONPATH=/work/base /work/main/.venv/bin/python -m benchmarks.studies.message_calls)
(cd /work/base && PYTHONPATH=/work/base /work/main/.venv/bin/python -m benchmarks.studies.message_calls --size 65536)
echo "=== calls after"
(cd /work/main && .venv/bin/python -m benchmarks.studies.message_calls)
(cd /work/main && .venv/bin/python -m benchmarks.studies.message_calls --size 65536)
