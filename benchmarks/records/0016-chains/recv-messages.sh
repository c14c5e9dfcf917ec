#!/bin/sh
echo "=== dev tests"
cd /work/dev && PYTHONPATH=/work/dev /work/main/.venv/bin/python -m pytest -q -p no:cacheprovider tests/channel -x 2>&1 | tail -2
for round in 1 2; do
  echo "=== before (main: the sink takes one recv_message each), round $round"
  (cd /work/main && .venv/bin/aiordma bench msg_rate --sizes 64 --compare perftest)
  echo "=== after (the sink takes them with recv_messages), round $round"
  (cd /work/dev && PYTHONPATH=/work/dev /work/main/.venv/bin/python -m aiordma.cli bench msg_rate --sizes 64 --compare perftest)
done
