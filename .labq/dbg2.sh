set -x
        .venv/bin/python examples/rpc_kv.py serve "$AIORDMA_ADDR" 7472 --max-clients 1 | {
          read -r ready && echo "host 1, server: $ready" &&
          echo "host 2, client (python examples/rpc_kv.py client $AIORDMA_ADDR 7472):" &&
          .venv/bin/python -m aiordma.lab.remote \
            .venv/bin/python examples/rpc_kv.py client "$AIORDMA_ADDR" 7472 &&
          sed "s/^/host 1, server: /"; }
echo done $?
