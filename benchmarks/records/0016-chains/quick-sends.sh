#!/bin/sh
echo "=== dev tests"
cd /work/dev && PYTHONPATH=/work/dev /work/main/.venv/bin/python -m pytest -q -p no:cacheprovider tests/verbs tests/channel/test_channel.py -x 2>&1 | tail -3
cd /work/dev && AIORDMA_PURE=1 PYTHONPATH=/work/dev /work/main/.venv/bin/python -m pytest -q -p no:cacheprovider tests/verbs/test_engine.py tests/verbs/test_driver.py -x 2>&1 | tail -2
for round in 1 2; do
  echo "=== before (main), round $round"
  (cd /work/main && .venv/bin/aiordma bench send_rate --sizes 64 --compare perftest)
  echo "=== after (quick_sends), round $round"
  (cd /work/dev && PYTHONPATH=/work/dev /work/main/.venv/bin/python -m aiordma.cli bench send_rate --sizes 64 --compare perftest)
done
