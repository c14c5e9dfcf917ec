#!/bin/sh
# Dask on rdma://, ucxx:// (distributed-ucxx 0.52 on UCX 1.21 with verbs) and tcp://, one boot;
# then ib_read_bw at 64 MiB for the fetch's reference
cd /work/main
export RAPIDS_LIBUCX_PREFER_SYSTEM_LIBRARY=true LD_LIBRARY_PATH=/work/peers/ucx/lib
export UCX_TLS=rc_verbs,self UCX_NET_DEVICES=rxe0:1
before=$(cat /sys/class/infiniband/rxe0/ports/1/hw_counters/sent_pkts)
/work/peers/ucxx/bin/python -m benchmarks.studies.dask_cluster --protocol rdma ucxx tcp
after=$(cat /sys/class/infiniband/rxe0/ports/1/hw_counters/sent_pkts)
echo "rxe0 sent_pkts during the study: $((after - before))"
.venv/bin/aiordma bench read_bw --sizes 67108864 --compare perftest
