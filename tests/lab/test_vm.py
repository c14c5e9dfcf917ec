"""Lab plumbing that needs no guest: kernel choice, the import guard, the CLI."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from aiordma.cli import build_parser
from aiordma.exceptions import LabError
from aiordma.lab.vm import find_kernel, guest_script, missing_host_tools, probe_kvm


def _kernel(boot: Path, modules: Path, version: str, rxe: bool) -> None:
    (boot / f"vmlinuz-{version}").write_bytes(b"")
    moddir = modules / version / "kernel/drivers/infiniband/sw/rxe"
    moddir.mkdir(parents=True)
    if rxe:
        (moddir / "rdma_rxe.ko.xz").write_bytes(b"")


def test_find_kernel_picks_newest_with_rxe(tmp_path: Path) -> None:
    boot, modules = tmp_path / "boot", tmp_path / "modules"
    boot.mkdir()
    _kernel(boot, modules, "6.1.0-9-amd64", rxe=True)
    _kernel(boot, modules, "6.1.0-10-amd64", rxe=True)  # numerically newer than -9
    _kernel(boot, modules, "6.12.0-1-amd64", rxe=False)
    assert find_kernel(boot, modules).name == "vmlinuz-6.1.0-10-amd64"


def test_find_kernel_explains_what_is_missing(tmp_path: Path) -> None:
    with pytest.raises(LabError, match="linux-image-amd64"):
        find_kernel(tmp_path, tmp_path)


def test_missing_host_tools_are_named_by_their_distribution_packages() -> None:
    def nothing(_: str) -> None:
        return None

    def no_file(_: str) -> bool:
        return False

    assert missing_host_tools(nothing, no_file, "x86_64") == ["qemu-system-x86", "busybox-static"]
    assert missing_host_tools(nothing, no_file, "aarch64")[0] == "qemu-system-arm"
    # virtme-ng finds busybox by any of its names, on PATH or in the usual bin directories.
    on_path = {"qemu-system-x86_64": "/usr/bin/qemu-system-x86_64", "busybox": "/opt/bin/busybox"}
    assert missing_host_tools(on_path.get, no_file, "x86_64") == []
    in_sbin = {"/usr/bin/qemu-kvm", "/sbin/busybox.static"}
    assert missing_host_tools(nothing, in_sbin.__contains__, "x86_64") == []


def _boots(results: dict[bool, int | None]) -> tuple[list[bool], Callable[[bool], int | None]]:
    tried: list[bool] = []

    def boot(kvm: bool) -> int | None:
        tried.append(kvm)
        return results[kvm]

    return tried, boot


def test_the_kvm_probe_blames_kvm_only_when_the_same_guest_boots_without_it() -> None:
    tried, boot = _boots({True: 0, False: 0})
    assert probe_kvm(boot) is True
    assert tried == [True]
    tried, boot = _boots({True: None, False: 0})  # a nested KVM that hangs
    assert probe_kvm(boot) is False
    assert tried == [True]
    tried, boot = _boots({True: 1, False: 0})  # KVM fails, TCG boots: KVM's fault
    assert probe_kvm(boot) is False
    assert tried == [True, False]


def test_the_kvm_probe_keeps_the_trial_guests_output_in_a_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 81: QEMU's assertion from a KVM trial boot read like a crash."""
    from aiordma.lab import vm

    def trial(argv: list[str], env: dict[str, str], timeout: float | None, sink: object) -> int:
        assert sink is not None, "the trial guest's output must not reach the terminal"
        kvm = "--disable-kvm" not in argv
        sink.write(b"qemu-system-x86_64: error: failed to set MSR 0x10a\n" if kvm else b"ok\n")  # type: ignore[attr-defined]
        return 1 if kvm else 0

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(vm, "run_group", trial)
    monkeypatch.setattr(vm, "find_vng", lambda: "vng")
    monkeypatch.setattr(os, "access", lambda path, mode: True)
    assert vm.kvm_works(Path("/boot/vmlinuz-test"), refresh=True) is False
    shown = capsys.readouterr()
    assert "MSR" not in shown.out + shown.err
    assert shown.err.splitlines() == [
        "aiordma lab: probing whether KVM works here (up to 40 s, once per host)",
        f"aiordma lab: KVM does not work here; using TCG (software emulation); "
        f"the probe's output: {tmp_path / 'aiordma' / 'kvm-probe.log'}",
    ], shown.err
    kept = (tmp_path / "aiordma" / "kvm-probe.log").read_text()
    assert kept.count("--- trial boot") == 2, kept
    assert "failed to set MSR" in kept, kept
    assert "--- exit status 1" in kept, kept
    assert "--- exit status 0" in kept, kept


@pytest.mark.parametrize("tcg", [1, None])
def test_a_guest_that_fails_with_and_without_kvm_gives_no_verdict(tcg: int | None) -> None:
    # What a host without busybox-static did: vng failed at once, and the
    # failure was cached as "KVM does not work here".
    _, boot = _boots({True: 1, False: tcg})
    with pytest.raises(LabError, match="the cause is not KVM"):
        probe_kvm(boot)


def test_import_without_pyverbs_says_how_to_install() -> None:
    code = "import sys; sys.modules['pyverbs'] = None; import aiordma"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert proc.returncode != 0
    assert "ImportError" in proc.stderr
    assert "python3-pyverbs" in proc.stderr
    assert "--system-site-packages" in proc.stderr


def test_cli_parses_lab_options() -> None:
    args = build_parser().parse_args(
        ["lab", "--cpus", "3", "--memory", "2G", "--kvm", "no", "--", "pytest", "-x"]
    )
    assert (args.cpus, args.memory, args.kvm) == (3, "2G", "no")
    assert args.cmd[-2:] == ["pytest", "-x"]


_GUEST_STAND_IN = """
import os, signal, sys
from aiordma.lab.vm import Terminated, run_group
# Whatever ran the tests may have started them with SIGINT ignored (a
# background job of a shell does); an interactive lab run has Python's default.
signal.signal(signal.SIGINT, signal.default_int_handler)
# A stand-in for vng/QEMU: a shell that starts a long-lived child and waits.
try:
    run_group(["sh", "-c", "sleep 600 & echo $!; wait"], dict(os.environ), None)
except Terminated as exc:
    sys.exit(128 + exc.signum)
"""


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
def test_a_signal_to_the_lab_stops_the_whole_guest_process_group(signum: int) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", _GUEST_STAND_IN], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], 60)
        assert ready, "the stand-in guest did not start"
        guest = int(proc.stdout.readline())
        pidfd = os.pidfd_open(guest)
        proc.send_signal(signum)
        proc.wait(timeout=60)
        # The guest process must be gone too, not reparented to init.
        gone, _, _ = select.select([pidfd], [], [], 60)
        os.close(pidfd)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert gone, f"the guest stand-in (pid {guest}) outlived the lab after {signum!r}"
    # SIGINT ends Python by SIGINT itself (after KeyboardInterrupt), as usual.
    expected = -signum if signum == signal.SIGINT else 128 + signum
    assert proc.returncode == expected


def test_a_long_guest_command_goes_in_a_script_not_on_the_kernel_command_line(
    tmp_path: Path,
) -> None:
    # The demo's sh -c script plus the carried-over variables once passed the
    # kernel command line's 2,048 bytes: the guest booted and waited forever.
    script = 'printf "%s|" "$@"; echo "[$0] \'q\' $X"\n' + "# " + "x" * 4000 + "\n"
    argv = ["env", "X=a b", "sh", "-c", script, "zero", "one two", "$HOME", "\n"]
    command = guest_script(argv, tmp_path / "command.sh")
    assert len(command) < 200
    out = subprocess.run(command, shell=True, capture_output=True, text=True, check=True).stdout
    assert out == "one two|$HOME|\n|[zero] 'q' a b\n"
