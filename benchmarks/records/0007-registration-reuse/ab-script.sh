#!/bin/sh
# One lab boot: registration reuse A/B (base = 2930414, after = this tree, staged = after with a 1 MiB staging limit).
B=/work/main/.ab/base; A=/work/main; S=/work/main/.ab/staged; PY=/work/main/.venv/bin/python
cd /
for t in "$B" "$A" "$S"; do PYTHONPATH=$t $PY -c "import aiordma.channel.rendezvous as r, aiordma.channel.packets as p; print(r.__file__, r.STAGED_READ_LIMIT, p.__file__)"; done
for round in 1 2; do
  for tree in base after staged; do
    case $tree in base) T=$B;; after) T=$A;; staged) T=$S;; esac
    echo "== round $round: $tree"
    PYTHONPATH=$T $PY -m aiordma.cli bench msg_bw --sizes 1048576 --compare perftest --duration 2 --loop uvloop 2>&1 | grep -E "^(aiordma|tcp|perftest) "
    PYTHONPATH=$T $PY -m aiordma.cli bench msg_lat --sizes 1048576 --duration 2 --loop uvloop 2>&1 | grep -E "^(aiordma|tcp|perftest) "
  done
done
echo "== dask"
PYTHONPATH=$B $PY -m benchmarks.studies.dask_cluster --protocol rdma tcp 2>&1 | tail -3 | sed 's/^/base: /'
PYTHONPATH=$A $PY -m benchmarks.studies.dask_cluster --protocol rdma 2>&1 | tail -2 | sed 's/^/after: /'
