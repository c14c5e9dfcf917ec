#!/bin/sh
# One boot: the commit before (wheel on PYTHONPATH) and this tree, alternated.
cd /work/main
for round in 1 2; do
  for side in before after; do
    if [ $side = before ]; then P=/tmp/basepkg; else P=; fi
    echo "== round $round: $side"
    (cd /tmp && PYTHONPATH=$P /work/main/.venv/bin/python -c "import aiordma.verbs as v; print(v.per_message_path())")
    (cd /tmp && PYTHONPATH=$P /work/main/.venv/bin/python -m python -m benchmarks message_calls --verbs --rounds 300 | grep -i "calls per")
    (cd /tmp && PYTHONPATH=$P /work/main/.venv/bin/python -m aiordma bench send_lat write_lat read_lat msg_lat --sizes 64 --duration 4 2>&1 | grep "^aiordma ")
  done
  echo "== round $round: references"
  (cd /tmp && /work/main/.venv/bin/python -m aiordma bench send_lat --sizes 64 --duration 4 --compare perftest --compare tcp 2>&1 | grep -v "^#" | tail -5)
done
