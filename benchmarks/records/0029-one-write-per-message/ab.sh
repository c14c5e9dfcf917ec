# Medium messages in pieces (before: bb335c1, in /work/before) and as one
# RECORD each (after: this tree), alternated twice in one quiet boot, with
# ib_write_bw / ib_send_lat and asyncio TCP from the same run beside them.
# The message modes print, per message and side, the work requests posted,
# completions taken and wake-ups (aiordma.bench.counts).
# Run as: aiordma lab -- sh benchmarks/records/0029-one-write-per-message/ab.sh
for round in 1 2; do
  for tree in /work/before /work/main; do
    echo "== round $round: $tree ($(cd $tree && git log --oneline -1 | cut -c1-7))"
    cd $tree
    .venv/bin/aiordma bench msg_bw --sizes 65536,1048576 --depth 8 --duration 5 --compare perftest 2>&1 | grep -v '^\['
    .venv/bin/aiordma bench msg_into_bw --sizes 65536 --depth 8 --duration 5 --compare perftest 2>&1 | grep -v '^\['
    .venv/bin/aiordma bench msg_lat --sizes 64,65536 --duration 5 --compare perftest --compare tcp 2>&1 | grep -v '^\['
  done
done
