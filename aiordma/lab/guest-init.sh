#!/bin/sh
# Runs inside the lab guest as its only command: brings up Soft-RoCE on a
# dummy interface, then runs the user's command in the user's directory.
#   guest-init.sh DEVICE NETDEV ADDR4/PREFIX ADDR6/PREFIX CWD -- CMD...
set -eu
device="$1" netdev="$2" addr4="$3" addr6="$4" cwd="$5"
shift 5
[ "$1" = "--" ] && shift

fail() { echo "aiordma lab (guest): $*" >&2; exit 97; }

modprobe rdma_rxe || fail "modprobe rdma_rxe failed: this kernel has no Soft-RoCE"
ip link set lo up
ip link add "$netdev" type dummy
ip addr add "$addr4" dev "$netdev"
ip -6 addr add "$addr6" dev "$netdev" nodad
ip link set "$netdev" up
rdma link add "$device" type rxe netdev "$netdev" || fail "rdma link add $device failed"

# The port turns ACTIVE and the address GIDs appear asynchronously.
port=/sys/class/infiniband/$device/ports/1
tries=0
until grep -q ACTIVE "$port/state" 2>/dev/null && grep -qi ffff "$port"/gids/* 2>/dev/null; do
    tries=$((tries + 1))
    [ $tries -le 100 ] || fail "$device did not become ACTIVE with an IPv4 GID"
    sleep 0.05
done

cd "$cwd"
exec "$@"
