#!/bin/sh
cd /work/main
for round in 1 2; do
  .venv/bin/aiordma bench xfer_read xfer_write --sizes 65536 --compare perftest
done
