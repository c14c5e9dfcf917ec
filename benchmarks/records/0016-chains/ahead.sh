#!/bin/sh
echo "=== ib_read_bw reference at 64 MiB (the Dask fetch's size)"
cd /work/main && .venv/bin/aiordma bench read_bw --sizes 67108864 --iterations 30 --warmup 2 --compare perftest
echo "=== dev tests"
cd /work/dev && PYTHONPATH=/work/dev /work/main/.venv/bin/python -m pytest -q -p no:cacheprovider tests/channel -x 2>&1 | tail -5
for round in 1 2; do
  echo "=== before (main), round $round"
  (cd /work/main && .venv/bin/aiordma bench msg_bw --sizes 1048576 --compare perftest)
  echo "=== after (read-ahead), round $round"
  (cd /work/dev && PYTHONPATH=/work/dev /work/main/.venv/bin/python -m aiordma.cli bench msg_bw --sizes 1048576 --compare perftest)
done
