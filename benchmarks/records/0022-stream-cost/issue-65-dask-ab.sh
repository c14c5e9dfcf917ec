#!/bin/sh
# Issue 65, no regression for Dask: the cluster study (rdma:// and tcp://) with the commit
# before issue 65's work (0090ea1, /tmp/basepkg65) and this tree, alternated twice in one boot.
# Run as: aiordma lab -- sh benchmarks/records/0022-stream-cost/issue-65-dask-ab.sh
PY=/work/main/.venv/bin/python
cd /tmp
for round in 1 2; do
  for side in before after; do
    if [ $side = before ]; then P=/tmp/basepkg65; else P=; fi
    echo "== round $round: $side"
    PYTHONPATH=$P $PY -m benchmarks.studies.dask_cluster --protocol rdma tcp 2>&1 | grep -v "^\[\|WARN"
  done
done
