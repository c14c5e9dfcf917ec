cd /work/main
rm -f .labq/sched.json
.venv/bin/dask scheduler --protocol rdma --host $AIORDMA_ADDR --port 0 --scheduler-file .labq/sched.json --no-dashboard > .labq/sched.log 2>&1 &
s=$!
for i in $(seq 1 120); do [ -e .labq/sched.json ] && break; sleep 1; done
addr=$(python3 -c "import json;print(json.load(open('.labq/sched.json'))['address'])")
echo "addr $addr"
timeout 150 .venv/bin/dask worker $addr --host $AIORDMA_ADDR --nthreads 1 --memory-limit 0 --no-dashboard > .labq/worker.log 2>&1
echo worker rc=$?
kill $s; wait
