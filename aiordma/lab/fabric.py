"""The two-host lab: two QEMU guests joined by one point-to-point Ethernet link.

Each guest gets a virtio network card whose backend is one end of a link
on the host, so the guests reach each other and nothing else. The link is
a stream by default (QEMU's ``-netdev stream`` on a Unix socket in the
control directory: host 1's QEMU listens, host 2's connects, again after
each reboot): a guest that cannot take a frame yet holds the sender back,
so the link loses nothing that ``tc netem`` does not take away, as a
lossless (PFC) RoCE fabric. A Unix socket, not TCP: QEMU leaves Nagle's
algorithm on, which held a small frame sent behind another for the peer's
delayed acknowledgement, about 40 ms (decision record 0021).
``link="dgram"`` joins two UDP sockets on the loopback address instead,
which drop what the receiving QEMU cannot take in time, as a congested
lossy fabric (decision record 0020 measures both). Each brings up rxe
on its card: host 1 at 192.0.2.1 / 2001:db8::1, host 2 at 192.0.2.2 /
2001:db8::2. Host 1 runs the command; host 2 runs the agent
(:mod:`aiordma.lab.agent`), which runs what host 1 asks through a control
directory both guests can write. This process also serves two requests
from host 1 there: ``crash`` (kill host 2's QEMU, no shutdown: a machine
that died) and ``boot`` (start host 2 again).

Both guests are torn down when the command ends, fails, times out or this
process is interrupted or terminated; no QEMU process outlives the run.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from aiordma.exceptions import LabError
from aiordma.lab.vm import (
    GUEST_DEVICE,
    LAB_MTU,
    PASSTHROUGH,
    GuestConfig,
    check_host_tools,
    find_kernel,
    find_vng,
    guest_script,
    kvm_works,
    log,
    run_group,
    vng_argv,
    vng_env,
)

HOST_ADDRS = {1: ("192.0.2.1", "2001:db8::1"), 2: ("192.0.2.2", "2001:db8::2")}
"""IPv4 and IPv6 address of each lab host (documentation ranges)."""

PEER_READY_TIMEOUT = 300.0
"""How long host 1 waits for host 2's agent before giving up (TCG boots take
about 40 s with both guests booting on two cores)."""

STOP_GRACE = 15.0
"""Seconds host 2 gets to stop its agent before its QEMU is killed."""


@dataclass
class FabricConfig:
    """How to boot the two-host lab (each guest gets ``cpus`` and ``memory``)."""

    cpus: int = 1
    memory: str = "2G"
    mtu: tuple[int | None, int | None] = (None, None)
    """Each host's NIC MTU (None: :data:`~aiordma.lab.vm.LAB_MTU`)."""
    link: str = "stream"
    """``"stream"`` (a stream socket: back-pressure, no loss) or ``"dgram"`` (UDP: drops
    what the receiving side cannot take in time)."""
    preload: tuple[str, ...] = ("aiordma",)
    """Modules host 2's agent imports once; its Python jobs are forks of that
    interpreter (:mod:`aiordma.lab.forkserver`)."""

    def __post_init__(self) -> None:
        if self.link not in LINKS:
            raise LabError(f"the link is one of {', '.join(LINKS)}, not {self.link!r}")


LINKS = ("stream", "dgram")
"""The kinds of link between the two guests (see the module's docstring)."""

LISTEN_TIMEOUT = 60.0
"""Seconds host 1's QEMU has to listen on the stream link before host 2 starts."""


def _free_port() -> int:
    """A loopback UDP port free now."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _card(host: int) -> str:
    return f"-device virtio-net-pci,netdev=link,mac=52:54:00:00:01:{host:02x}"


def _stream_opts(host: int, path: Path) -> tuple[str, ...]:
    """QEMU options for the host's end of a stream link: host 1 listens on
    the Unix socket ``path``, host 2 connects to it."""
    end = "server=on" if host == 1 else "server=off"
    return (f"-netdev stream,id=link,{end},addr.type=unix,addr.path={path}", _card(host))


def _dgram_opts(host: int, local: int, remote: int) -> tuple[str, ...]:
    """QEMU options for the host's end of a datagram link: UDP from the
    loopback port ``local`` to ``remote``."""
    netdev = (
        f"-netdev dgram,id=link,local.type=inet,local.host=127.0.0.1,local.port={local},"
        f"remote.type=inet,remote.host=127.0.0.1,remote.port={remote}"
    )
    return (netdev, _card(host))


_ACCEPTING = 0x10000
"""``__SO_ACCEPTCON`` in ``/proc/net/unix``'s flags: the socket listens."""


def listening(path: Path, table: str = "/proc/net/unix") -> bool:
    """Whether a Unix socket listens at ``path`` (read from the kernel's
    table: a probe connection would be taken for the peer)."""
    with contextlib.suppress(OSError), open(table) as rows:
        for row in rows:
            fields = row.split()
            if len(fields) == 8 and fields[7] == str(path) and int(fields[3], 16) & _ACCEPTING:
                return True
    return False


def host_environment(host: int, control: Path) -> dict[str, str]:
    """What a command on lab host ``host`` finds about itself and its peer."""
    addr, addr6 = HOST_ADDRS[host]
    peer, peer6 = HOST_ADDRS[3 - host]
    return {
        "AIORDMA_LAB": "1",
        "AIORDMA_DEVICE": GUEST_DEVICE,
        "AIORDMA_ADDR": addr,
        "AIORDMA_ADDR6": addr6,
        "AIORDMA_HOSTS": "2",
        "AIORDMA_HOST": str(host),
        "AIORDMA_PEER_ADDR": peer,
        "AIORDMA_PEER_ADDR6": peer6,
        "AIORDMA_FABRIC": str(control),
    }


class _Fabric:
    """The two guests of one run, and host 2's lifecycle."""

    def __init__(self, cmd: list[str], guest: GuestConfig, cfg: FabricConfig, cwd: Path) -> None:
        self.kernel = guest.kernel or find_kernel()
        self.vng = find_vng()
        check_host_tools()
        self.kvm = kvm_works(self.kernel) if guest.kvm is None else guest.kvm
        self.control = Path(tempfile.mkdtemp(prefix="aiordma-fabric-"))
        (self.control / "jobs").mkdir()
        (self.control / "control").mkdir()
        self.cwd = cwd
        rwdirs = list(dict.fromkeys([cwd, self.control, *guest.rwdirs]))
        self.guest = GuestConfig(cfg.cpus, cfg.memory, self.kvm, rwdirs, self.kernel)
        self.cfg = cfg
        self.socket = self.control / "link.sock"
        """The stream link's Unix socket (host 1's QEMU listens on it)."""
        self.ports = (_free_port(), _free_port()) if cfg.link == "dgram" else (0, 0)
        """The datagram link's UDP ports (host 1's, host 2's); unused by a stream."""
        self.cmd = cmd
        self.host2: subprocess.Popen[bytes] | None = None
        self.host2_log = self.control / "host2.log"
        self._lock = threading.Lock()
        self._done = threading.Event()

    def _argv(self, host: int, cmd: list[str]) -> list[str]:
        env = {k: v for k, v in os.environ.items() if PASSTHROUGH.match(k)}
        env |= host_environment(host, self.control)
        mtu = self.cfg.mtu[host - 1] or LAB_MTU
        addr, addr6 = HOST_ADDRS[host]
        init = resources.files("aiordma.lab") / "guest-init.sh"
        inner = [
            "sh", str(init), GUEST_DEVICE, f"nic:{mtu}", f"{addr}/24",
            f"{addr6}/64", str(self.cwd), "--",
            "env", *(f"{k}={v}" for k, v in sorted(env.items())), *cmd,
        ]  # fmt: skip
        if self.cfg.link == "stream":
            opts = _stream_opts(host, self.socket)
        else:
            local, remote = self.ports if host == 1 else self.ports[::-1]
            opts = _dgram_opts(host, local, remote)
        command = guest_script(inner, self.control / f"host{host}.sh")
        return vng_argv(self.vng, self.kernel, self.guest, self.kvm, command, opts)

    def boot_host2(self) -> None:
        with self._lock:
            with contextlib.suppress(FileNotFoundError):
                (self.control / "host2.ready").unlink()
            (self.control / "stop").unlink(missing_ok=True)
            agent = [sys.executable, "-m", "aiordma.lab.agent"]
            argv = self._argv(2, [*agent, str(self.control), *self.cfg.preload])
            with open(self.host2_log, "ab") as log:
                self.host2 = subprocess.Popen(
                    argv,
                    env=vng_env(),
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )

    def _boot_host2_when_listening(self) -> None:
        deadline = time.monotonic() + LISTEN_TIMEOUT
        while not listening(self.socket):
            if self._done.is_set():
                return
            if time.monotonic() > deadline:
                log(f"host 1's QEMU did not listen on {self.socket} within "
                    f"{LISTEN_TIMEOUT:.0f} s; host 2 is not booted")  # fmt: skip
                return
            time.sleep(0.05)
        if not self._done.is_set():
            self.boot_host2()

    def kill_host2(self) -> None:
        """Kill host 2's QEMU at once (a machine that died: nothing is sent)."""
        with self._lock:
            proc, self.host2 = self.host2, None
        if proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()

    def stop_host2(self) -> None:
        """Ask host 2's agent to stop, then make sure its QEMU is gone."""
        (self.control / "stop").touch()
        proc = self.host2
        if proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(STOP_GRACE)
        self.kill_host2()

    def serve_requests(self) -> None:
        """Host 1's ``crash`` and ``boot`` requests (``control/ID.json``)."""
        requests = self.control / "control"
        while not self._done.wait(0.1):
            for request in sorted(requests.glob("*.json")):
                try:
                    action = json.loads(request.read_text())["action"]
                except (OSError, ValueError, KeyError, TypeError):
                    continue  # not fully written yet
                request.unlink()
                if action == "crash":
                    log("host 2 crashed on request (its QEMU was killed)")
                    self.kill_host2()
                elif action == "boot":
                    log("booting host 2 again on request")
                    self.boot_host2()
                (requests / f"{request.stem}.done").write_text(action)

    def _link_text(self) -> str:
        if self.cfg.link == "stream":
            return f"linked by a stream (host 1 listens on {self.socket})"
        return f"linked by UDP 127.0.0.1:{self.ports[0]} <-> 127.0.0.1:{self.ports[1]}"

    def run(self, timeout: float | None) -> int:
        mode = "KVM" if self.kvm else "TCG, software emulation"
        log(
            f"booting two {self.kernel.name} guests ({mode}, {self.guest.cpus} CPU and "
            f"{self.guest.memory} each), {self._link_text()}; "
            f"{GUEST_DEVICE} on host 1 at {HOST_ADDRS[1][0]} and "
            f"{HOST_ADDRS[1][1]}, host 2 at {HOST_ADDRS[2][0]} and {HOST_ADDRS[2][1]}"
        )
        log(f"control directory: {self.control}; host 2's console: {self.host2_log}")
        started = time.monotonic()
        server = threading.Thread(target=self.serve_requests, name="aiordma-fabric", daemon=True)
        rc = 1
        try:
            if self.cfg.link == "stream":  # host 2 connects once host 1's QEMU listens
                threading.Thread(target=self._boot_host2_when_listening,
                                 name="aiordma-fabric-boot", daemon=True).start()  # fmt: skip
            else:
                self.boot_host2()
            server.start()
            waited = [
                "sh", "-c",
                'n=0; until [ -e "$1/host2.ready" ]; do n=$((n+1)); '
                f'[ $n -le {int(PEER_READY_TIMEOUT * 5)} ] || '
                '{ echo "aiordma lab: host 2 did not come up" >&2; exit 97; }; sleep 0.2; done; '
                'shift; exec "$@"',
                "wait-for-host-2", str(self.control), *self.cmd,
            ]  # fmt: skip
            rc = run_group(self._argv(1, waited), vng_env(), timeout)
            return rc
        finally:
            self._done.set()
            if server.is_alive():
                server.join()
            self.stop_host2()
            if rc != 0 and self.host2_log.exists():
                tail = self.host2_log.read_bytes()[-3000:].decode(errors="replace")
                log(f"host 2's console (last lines):\n{tail}")
            log(f"two-host lab finished with exit status {rc} after "
                 f"{time.monotonic() - started:.0f} s")  # fmt: skip
            shutil.rmtree(self.control, ignore_errors=True)


def run_on_fabric(
    cmd: list[str],
    guest: GuestConfig,
    cfg: FabricConfig | None = None,
    *,
    cwd: Path | None = None,
    timeout: float | None = None,
) -> int:
    """Boot the two-host lab, run ``cmd`` on host 1, return its exit status."""
    if not cmd:
        raise LabError("no command given to run in the lab")
    fabric = _Fabric(cmd, guest, cfg or FabricConfig(), (cwd or Path.cwd()).resolve())
    return fabric.run(timeout)
