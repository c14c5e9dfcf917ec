exec > /work/main/.labq/dbg.out 2>&1
set -x
date
.venv/bin/python examples/rpc_kv.py serve "$AIORDMA_ADDR" 7472 --max-clients 1 > .labq/srv.out 2>&1 &
srv=$!
for i in $(seq 1 120); do grep -q listening .labq/srv.out && break; sleep 1; done
cat .labq/srv.out
date
timeout 200 .venv/bin/python -m aiordma.lab.remote .venv/bin/python examples/rpc_kv.py client "$AIORDMA_ADDR" 7472
echo rc=$?
date
wait $srv
echo srv rc=$?
cat .labq/srv.out
