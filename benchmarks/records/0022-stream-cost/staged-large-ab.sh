#!/bin/sh
# Record 0022, "What bounds a stream of 1 MiB messages": would a registered landing buffer
# (a copy out instead of a registration per message) pay at 1 MiB? This tree against a copy
# of it whose STAGED_READ_LIMIT is 2 MiB (1 MiB messages staged and copied out, so none read
# ahead), prepared with:
#   cp -r aiordma /tmp/varA/ && sed -i 's/^STAGED_READ_LIMIT = 256 << 10/STAGED_READ_LIMIT = 2 << 20/' \
#     /tmp/varA/aiordma/channel/rendezvous.py
# msg_bw (new objects) and msg_reg_bw (registered memory on both sides: no registration on
# the path at all), alternated twice, perftest beside each.
# Run as: aiordma lab -- sh benchmarks/records/0022-stream-cost/staged-large-ab.sh
B="bench --loop uvloop"
for round in 1 2; do
  for side in now staged2m; do
    if [ $side = now ]; then P=; else P=/tmp/varA; fi
    echo "== round $round: $side"
    (cd /tmp && PYTHONPATH=$P /work/main/.venv/bin/python -m aiordma $B msg_bw msg_reg_bw --sizes 1048576 --duration 5 --compare perftest 2>&1 | grep "/s\|rror")
  done
done
