"""Boot a throw-away QEMU guest with Soft-RoCE, via virtme-ng, and run a command in it.

virtme-ng boots an installed distribution kernel with the host's own
filesystem as the guest's (read-only) root, so the project, its virtualenv
and the distribution's pyverbs are all visible inside without building an
image. Only directories passed as ``rwdirs`` keep their writes.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import selectors
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import BinaryIO

from aiordma.exceptions import LabError

GUEST_DEVICE = "rxe0"
GUEST_NETDEV = "dummy0"
LAB_MTU = 9000
"""The MTU of the lab's cards (the dummy one, and the two hosts' link):
jumbo frames, so rxe sends 4096-byte packets as RoCE fabrics are set up,
not the 1024 an Ethernet default leaves it (decision record 0021)."""
# Documentation ranges (RFC 5737, RFC 3849): never routed anywhere real.
GUEST_ADDR4 = "192.0.2.1"
GUEST_ADDR6 = "2001:db8::1"

KVM_PROBE_TIMEOUT = 40.0
"""A KVM guest boots in a few seconds; a broken nested KVM hangs forever."""
TCG_PROBE_TIMEOUT = 180.0
"""A trivial guest under software emulation boots in 25-70 s."""

# Variables worth carrying into the guest, whose environment starts empty.
PASSTHROUGH = re.compile(r"^(AIORDMA_|PYTEST_|PY|CI$|TERM$|COLUMNS$|LANG$|LC_|NO_COLOR$)")


def log(msg: str) -> None:
    print(f"aiordma lab: {msg}", file=sys.stderr, flush=True)


def _kernel_version(path: Path) -> str:
    return path.name.removeprefix("vmlinuz-")


def _version_key(version: str) -> list[int]:
    return [int(n) for n in re.findall(r"\d+", version)]


def find_kernel(boot: Path = Path("/boot"), modules: Path = Path("/lib/modules")) -> Path:
    """The newest installed kernel image whose modules include ``rdma_rxe``."""
    candidates = []
    for image in boot.glob("vmlinuz-*"):
        moddir = modules / _kernel_version(image)
        if any(moddir.glob("kernel/drivers/infiniband/sw/rxe/rdma_rxe.ko*")):
            candidates.append(image)
    if not candidates:
        raise LabError(
            "no installed kernel has the rdma_rxe module: install one "
            "(Debian: linux-image-amd64, Ubuntu: linux-image-generic) or run './dev setup'"
        )
    return max(candidates, key=lambda p: _version_key(_kernel_version(p)))


def find_vng() -> str:
    """Path of virtme-ng's ``vng``, preferring the one next to this interpreter."""
    local = Path(sys.executable).parent / "vng"
    found = str(local) if local.exists() else shutil.which("vng")
    if not found:
        raise LabError("virtme-ng is not installed: pip install 'aiordma[lab]' (or ./dev setup)")
    return found


def _qemu_package(machine: str) -> str:
    return {"x86_64": "qemu-system-x86", "aarch64": "qemu-system-arm"}.get(machine, "qemu-system")


def missing_host_tools(
    which: Callable[[str], str | None] = shutil.which,
    isfile: Callable[[str], bool] = os.path.isfile,
    machine: str | None = None,
) -> list[str]:
    """The distribution packages (Debian's names) the host lacks to boot a guest.

    virtme-ng needs a QEMU for this architecture and a busybox to build the
    guest's initramfs (a static one: the initramfs has no libraries). It looks
    for them by these names, on ``PATH`` and in the usual ``bin`` directories.
    """
    machine = machine or os.uname().machine

    def found(*names: str) -> bool:
        dirs = ("/usr/local/bin", "/usr/local/sbin", "/usr/bin", "/usr/sbin", "/bin", "/sbin")
        return any(which(n) or any(isfile(f"{d}/{n}") for d in dirs) for n in names)

    missing = []
    if not found(f"qemu-system-{machine}", "qemu-kvm"):
        missing.append(_qemu_package(machine))
    if not found("busybox-static", "busybox.static", "busybox"):
        missing.append("busybox-static")
    return missing


def check_host_tools() -> None:
    """Raise :class:`LabError` naming each distribution package the lab lacks."""
    missing = missing_host_tools()
    if missing:
        raise LabError(
            f"the lab cannot boot a guest: install {' '.join(missing)} "
            f"(Debian/Ubuntu: sudo apt-get install {' '.join(missing)}; or run ./dev setup "
            "in a checkout); docs/lab.md, 'What the lab needs', lists everything"
        )


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "aiordma"


@dataclass
class GuestConfig:
    """How to boot the lab guest."""

    cpus: int = 2
    memory: str = "4G"
    kvm: bool | None = None
    """True/False forces KVM or TCG; None probes once and caches the verdict."""
    rwdirs: list[Path] = field(default_factory=list)
    kernel: Path | None = None


def vng_argv(
    vng: str,
    kernel: Path,
    cfg: GuestConfig,
    kvm: bool,
    command: str,
    qemu_opts: tuple[str, ...] = (),
) -> list[str]:
    argv = [vng, "-r", str(kernel), "--memory", cfg.memory, "--cpus", str(cfg.cpus)]
    if not kvm:
        # Under TCG the kernel finds the vCPUs' TSCs unsynchronised and falls
        # back to the HPET: every clock read becomes a system call and an
        # emulated device access, which slows every event-loop turn. QEMU's
        # TSC is derived from one virtual clock, so it can be trusted.
        argv += ["--disable-kvm", "--append", "tsc=reliable"]
    for d in cfg.rwdirs:
        argv += ["--rwdir", str(d)]
    for opt in qemu_opts:
        argv.append(f"--qemu-opts={opt}")  # "=": the value starts with a dash
    return [*argv, "--exec", command]


def guest_script(argv: list[str], path: Path) -> str:
    """Write ``argv`` as a shell script at ``path``; return the command that runs it.

    virtme-ng hands its ``--exec`` command to the guest on the kernel command
    line, which the kernel cuts at 2,048 bytes: a longer command (a script
    given to ``sh -c``, many variables carried over) would be cut, and the
    guest would boot and wait forever with nothing to run. The file has no
    such limit; ``path`` must be in a directory the guest can see.
    """
    path.write_text(f"exec {shlex.join(argv)}\n")
    return shlex.join(["sh", str(path)])


def _relay(
    proc: subprocess.Popen[bytes], timeout: float | None, sink: BinaryIO | None = None
) -> int:
    """Copy the child's stdout/stderr to ours (or both to ``sink``) until it
    exits; return its status.

    vng is given pipes, not our descriptors: QEMU writes its console through
    descriptors of its own, which on a regular file clobber what we logged.
    """
    assert proc.stdout is not None
    assert proc.stderr is not None
    deadline = None if timeout is None else time.monotonic() + timeout
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ, sink or sys.stdout.buffer)
        sel.register(proc.stderr, selectors.EVENT_READ, sink or sys.stderr.buffer)
        while sel.get_map():
            wait = None if deadline is None else deadline - time.monotonic()
            if wait is not None and wait <= 0:
                raise subprocess.TimeoutExpired(proc.args, timeout or 0.0)
            for key, _ in sel.select(wait):
                data = os.read(key.fd, 65536)
                if not data:
                    sel.unregister(key.fileobj)
                    continue
                key.data.write(data.replace(b"\0", b""))
                key.data.flush()
    return proc.wait()


class Terminated(BaseException):
    """This process got SIGTERM or SIGHUP while a guest ran (the guest was killed)."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"terminated by {signal.Signals(signum).name}")
        self.signum = signum


def _terminated(signum: int, _frame: object) -> None:
    raise Terminated(signum)


@contextlib.contextmanager
def _teardown_on_signals() -> Iterator[None]:
    """Turn SIGTERM and SIGHUP into :class:`Terminated` (as SIGINT is turned into
    KeyboardInterrupt), so whoever stops us (``timeout``, a CI cancel, a closed
    terminal) also stops the guest instead of orphaning it."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, _terminated) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def run_group(
    argv: list[str], env: dict[str, str], timeout: float | None, sink: BinaryIO | None = None
) -> int:
    """Run ``argv`` in its own process group; kill the whole group on timeout,
    interrupt (SIGINT) or termination (SIGTERM, SIGHUP: raises :class:`Terminated`).
    Its output goes to ours, or to ``sink`` if given."""
    with _teardown_on_signals():
        return _run_group_now(argv, env, timeout, sink)


def _run_group_now(
    argv: list[str], env: dict[str, str], timeout: float | None, sink: BinaryIO | None
) -> int:
    proc = subprocess.Popen(
        argv,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        return _relay(proc, timeout, sink)
    except BaseException:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise
    finally:
        proc.stdout.close()  # type: ignore[union-attr]
        proc.stderr.close()  # type: ignore[union-attr]


def vng_env() -> dict[str, str]:
    env = dict(os.environ)
    # vng runs virtme-run by name.
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env


def kvm_works(kernel: Path, *, refresh: bool = False) -> bool:
    """Whether a KVM-accelerated guest really boots here (cached per host and kernel).

    ``/dev/kvm`` existing proves little: nested KVM can hang during boot. So
    boot a trivial guest once with a timeout and remember the answer.
    """
    if not os.access("/dev/kvm", os.R_OK | os.W_OK):
        return False
    key = f"{os.uname().release}|{kernel}"
    cache = _cache_dir() / "kvm-verdict.json"
    try:
        verdicts: dict[str, bool] = json.loads(cache.read_text())
    except (OSError, ValueError):
        verdicts = {}
    if not refresh and key in verdicts:
        return verdicts[key]
    vng = find_vng()
    log(f"probing whether KVM works here (up to {KVM_PROBE_TIMEOUT:.0f} s, once per host)")
    # What the trial guests print (QEMU's assertions when nested KVM cannot
    # run one) is the probe's evidence, not news for the user: it goes to a file.
    cache.parent.mkdir(parents=True, exist_ok=True)
    evidence = _cache_dir() / "kvm-probe.log"

    def boot(kvm: bool) -> int | None:
        cfg = GuestConfig(cpus=1, memory="512M")
        timeout = KVM_PROBE_TIMEOUT if kvm else TCG_PROBE_TIMEOUT
        with evidence.open("ab") as sink:
            sink.write(f"--- trial boot, {'KVM' if kvm else 'TCG'}\n".encode())
            sink.flush()
            try:
                argv = vng_argv(vng, kernel, cfg, kvm, "true")
                status = run_group(argv, vng_env() | {"TERM": "dumb"}, timeout, sink)
            except subprocess.TimeoutExpired:
                status = None
            sink.write(
                f"--- {'timed out' if status is None else f'exit status {status}'}\n".encode()
            )
        return status

    evidence.write_bytes(b"")
    ok = probe_kvm(boot)
    tcg = "KVM does not work here; using TCG (software emulation)"
    log("KVM works" if ok else f"{tcg}; the probe's output: {evidence}")
    verdicts[key] = ok
    cache.write_text(json.dumps(verdicts, indent=1))
    return ok


def probe_kvm(boot: Callable[[bool], int | None]) -> bool:
    """Decide from trial boots whether KVM works; raise if no verdict can be had.

    ``boot(kvm)`` boots a trivial guest and returns its exit status, or None
    if it timed out. A KVM guest that hangs is the failure being probed for.
    One that exits with an error may have failed for any reason (a missing
    tool, a broken kernel image), so the same guest is tried under TCG: only
    if that one boots is KVM to blame. If it fails too, the probe said
    nothing about KVM, and no verdict may be cached from it.
    """
    status = boot(True)
    if status == 0:
        return True
    if status is None:
        return False
    tcg = boot(False)
    if tcg == 0:
        return False
    raise LabError(
        f"a trivial guest failed to boot both with KVM (exit status {status}) and without "
        f"({'timed out' if tcg is None else f'exit status {tcg}'}): the cause is not KVM; "
        f"see virtme-ng's output in {_cache_dir() / 'kvm-probe.log'} (nothing was cached)"
    )


def lab_environment() -> dict[str, str]:
    """Variables that tell a command where the lab's device is."""
    return {
        "AIORDMA_LAB": "1",
        "AIORDMA_DEVICE": GUEST_DEVICE,
        "AIORDMA_ADDR": GUEST_ADDR4,
        "AIORDMA_ADDR6": GUEST_ADDR6,
    }


def run_in_guest(
    cmd: list[str], cfg: GuestConfig, *, cwd: Path | None = None, timeout: float | None = None
) -> int:
    """Boot a guest with ``rxe0`` on ``dummy0`` and run ``cmd`` there; return its exit status."""
    if not cmd:
        raise LabError("no command given to run in the lab")
    kernel = cfg.kernel or find_kernel()
    vng = find_vng()
    check_host_tools()
    cwd = (cwd or Path.cwd()).resolve()
    kvm = kvm_works(kernel) if cfg.kvm is None else cfg.kvm
    scripts = Path(tempfile.mkdtemp(prefix="aiordma-lab-"))  # the guest's command
    rwdirs = list(dict.fromkeys([cwd, *cfg.rwdirs]))
    cfg = GuestConfig(cfg.cpus, cfg.memory, kvm, [*rwdirs, scripts], kernel)

    env = {k: v for k, v in os.environ.items() if PASSTHROUGH.match(k)}
    env |= lab_environment()
    init = resources.files("aiordma.lab") / "guest-init.sh"
    inner = [
        "sh", str(init), GUEST_DEVICE, f"{GUEST_NETDEV}:{LAB_MTU}", f"{GUEST_ADDR4}/24",
        f"{GUEST_ADDR6}/64", str(cwd), "--",
        "env", *(f"{k}={v}" for k, v in sorted(env.items())), *cmd,
    ]  # fmt: skip
    mode = "KVM" if kvm else "TCG, software emulation"
    log(
        f"booting {kernel.name} in a QEMU guest ({mode}, {cfg.cpus} CPUs, {cfg.memory}); "
        f"{GUEST_DEVICE} on {GUEST_NETDEV} at {GUEST_ADDR4} and {GUEST_ADDR6}"
    )
    log(f"writable in the guest: {', '.join(map(str, rwdirs))}")
    started = time.monotonic()
    try:
        command = guest_script(inner, scripts / "command.sh")
        rc = run_group(vng_argv(vng, kernel, cfg, kvm, command), vng_env(), timeout)
    finally:
        shutil.rmtree(scripts, ignore_errors=True)
    log(f"guest finished with exit status {rc} after {time.monotonic() - started:.0f} s")
    return rc
