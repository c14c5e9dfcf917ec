#!/bin/sh
# Issue 53: no slower. Before (1813ed2, "$BEFORE") and after (main), alternated in one boot.
# BEFORE: a checkout of 1813ed2 built in place (setup.py build_ext --inplace); AFTER: this tree.
BEFORE=${BEFORE:?set BEFORE to the old checkout}
AFTER=${AFTER:-$(cd "$(dirname "$0")/../../.." && pwd)}
for round in 1 2; do
  echo "=== before, round $round"
  (cd "$BEFORE" && PYTHONPATH="$BEFORE" "$AFTER"/.venv/bin/python -m aiordma.cli bench msg_lat rpc_lat --sizes 64 2>&1 | grep -v '^\[')
  (cd "$BEFORE" && PYTHONPATH="$BEFORE" "$AFTER"/.venv/bin/python -m aiordma.cli bench xfer_read --compare perftest 2>&1 | grep -v '^\[')
  echo "=== after, round $round"
  (cd "$AFTER" && .venv/bin/aiordma bench msg_lat rpc_lat --sizes 64 --compare tcp 2>&1 | grep -v '^\[')
  (cd "$AFTER" && .venv/bin/aiordma bench xfer_read --compare perftest 2>&1 | grep -v '^\[')
done
