#!/bin/sh
# One boot: the commit before (wheel on PYTHONPATH) and this tree, alternated twice.
B="bench --loop uvloop --sizes 64 --warmup 50"
for round in 1 2; do
  for side in before after; do
    if [ $side = before ]; then P=/tmp/basepkg2; else P=; fi
    echo "== round $round: $side"
    (cd /tmp && PYTHONPATH=$P /work/main/.venv/bin/python -c "import aiordma.verbs as v; print(v.per_message_path())")
    (cd /tmp && PYTHONPATH=$P /work/main/.venv/bin/python -m python -m benchmarks message_calls --verbs --rounds 200 | grep -i "calls per")
    (cd /tmp && PYTHONPATH=$P /work/main/.venv/bin/python -m python -m benchmarks message_calls --rpc --rounds 200 | grep -i "calls per")
    (cd /tmp && PYTHONPATH=$P /work/main/.venv/bin/python -m aiordma $B send_lat msg_lat rpc_lat --iterations 300 --compare tcp 2>&1 | grep "us ")
  done
done
