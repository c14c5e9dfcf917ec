#!/bin/sh
# Runs inside the lab guest as its only command: brings up Soft-RoCE on a
# dummy interface (single-host lab: NETDEV "NAME[:MTU]") or on the guest's
# network card (two-host lab: NETDEV "nic[:MTU]"), then runs the user's
# command in the user's directory.
#   guest-init.sh DEVICE NETDEV ADDR4/PREFIX ADDR6/PREFIX CWD -- CMD...
set -eu
device="$1" netdev="$2" addr4="$3" addr6="$4" cwd="$5"
shift 5
[ "$1" = "--" ] && shift

fail() { echo "aiordma lab (guest): $*" >&2; exit 97; }

modprobe rdma_rxe || fail "modprobe rdma_rxe failed: this kernel has no Soft-RoCE"
ip link set lo up
mtu=""
case "$netdev" in *:*) mtu="${netdev#*:}"; netdev="${netdev%%:*}" ;; esac
case "$netdev" in
  nic)
    modprobe virtio_net 2>/dev/null || true
    netdev=""
    for tries in $(seq 100); do
        for path in /sys/class/net/*; do
            name="${path##*/}"
            [ "$name" = lo ] || { netdev="$name"; break; }
        done
        [ -n "$netdev" ] && break
        sleep 0.05
    done
    [ -n "$netdev" ] || fail "the guest has no network card for the two-host link"
    export AIORDMA_NIC="$netdev"  # the link the two-host tests act on
    ;;
  *) ip link add "$netdev" type dummy ;;
esac
# rxe's packets carry the largest RoCE MTU (256 to 4096 bytes) that fits the
# card's MTU; set before rxe binds.
[ -z "$mtu" ] || ip link set "$netdev" mtu "$mtu" || fail "cannot set MTU $mtu on $netdev"
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
