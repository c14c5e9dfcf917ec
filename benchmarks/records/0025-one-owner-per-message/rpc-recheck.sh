# The round trips again, before (5dc9a23, in /work/before) and after (this
# tree), alternated twice in one boot, asyncio TCP from the same run beside
# each. Run as: aiordma lab -- sh benchmarks/records/0025-one-owner-per-message/rpc-recheck.sh
for round in 1 2; do
  for tree in /work/before /work/main; do
    echo "== round $round: $tree ($(cd $tree && git log --oneline -1 | cut -c1-7))"
    (cd $tree && .venv/bin/aiordma bench send_lat msg_lat rpc_lat --duration 5 --loop uvloop \
      --compare tcp 2>&1 | grep -v '^\[')
  done
done
