# 64 B ping-pong with the ring off by default: before (bb335c1, /work/before) and after, alternated twice.
cd /work/main && .venv/bin/python -c "import aiordma.verbs as v; print('main:', v.per_message_path())"
.venv/bin/python -m pytest -q -p no:cacheprovider tests/channel/test_records.py tests/channel/test_receiver.py tests/channel/test_channel.py -m "rdma and not two_hosts" 2>&1 | tail -3
for round in 1 2; do for tree in /work/before /work/main; do echo "== $round $tree"; cd $tree; .venv/bin/aiordma bench msg_lat --sizes 64 --duration 5 --compare tcp 2>&1 | grep -v '^\[' | grep -v "^perftest"; done; done
