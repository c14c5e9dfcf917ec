"""Start ``python -m MODULE``, ``python -c CODE`` or ``python SCRIPT`` as
a fork of an interpreter that has already imported what the program needs.

In a lab guest a fresh interpreter pays seconds before it runs a line of
its own: CPython runs about 15x slower under software emulation, and each
of the ~1,500 file lookups of ``import aiordma`` crosses the guest's 9p
root. A test suite that starts a peer process per test pays that each
time. A fork server pays it once: it imports the modules it was told to,
then forks one child per request, and the child runs the program as
``python`` would (as ``__main__``, with its ``sys.argv`` and
``sys.path[0]``, the requested working directory and environment) and
exits through the interpreter's normal shutdown. A program that is not
under the preloaded modules still runs; it imports what it needs itself.

Contract: ``start(preload)`` → ``spawn(...)``/``popen(...)`` per child →
``close()``. The server never opens a device, starts a thread or runs an
event loop, so a fork of it is as clean as a fresh interpreter apart from
the modules already imported. A request whose environment changes what
those modules read at import (``IMPORT_TIME``, any ``PYTHON*`` variable)
must start a fresh interpreter instead: :meth:`ForkServer.can_run` says so.

The wire, one Unix stream connection per child: the client sends one JSON
line (the interpreter's arguments, cwd, env, new session) with the child's stdin, stdout and stderr
attached (``SCM_RIGHTS``); the server answers ``pid N`` once the child
exists and ``exit CODE`` when it ended (``-N``: killed by signal N, as
:attr:`subprocess.Popen.returncode`). The server exits, killing its
children, when its own stdin reaches end of file (the client went away).
Each request raises the audit event ``aiordma.lab.forkserver.spawn``
(the interpreter's arguments) in the client, as ``subprocess.Popen`` does for a program.
"""

from __future__ import annotations

import array
import asyncio
import contextlib
import functools
import importlib
import json
import os
import runpy
import select
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import types
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import IO

from aiordma.exceptions import LabError

IMPORT_TIME = ("AIORDMA_PURE", "AIORDMA_METRICS")
"""Environment variables aiordma reads at import: a child whose environment
changes one of them cannot be a fork of a server that imported aiordma."""

_FDS = 3  # stdin, stdout, stderr travel with every request


@dataclass
class _Request:
    argv: list[str]
    cwd: str
    env: dict[str, str]
    new_session: bool = False


def program(argv: Sequence[str]) -> tuple[str, str, list[str]]:
    """The interpreter's arguments ``argv`` as (kind, target, the program's
    arguments): ``-m MODULE``, ``-c CODE`` or ``PATH``, then the rest.

    Raises :class:`ValueError` for anything else (an interpreter option, a
    program read from stdin): a fork could not be that interpreter."""
    argv = list(argv)
    if argv[:1] in (["-m"], ["-c"]) and len(argv) >= 2:
        return argv[0], argv[1], list(argv[2:])
    if argv and argv[0] and not argv[0].startswith("-"):
        return "path", argv[0], list(argv[1:])
    raise ValueError(f"a fork runs -m MODULE, -c CODE or a script's path, not {list(argv)!r}")


def _run(kind: str, target: str, args: list[str], cwd: str) -> None:
    """Run the program as ``python`` would run it, as ``__main__``."""
    if kind == "-m":
        sys.path[0] = cwd
        sys.argv = [target, *args]  # runpy puts the module's file first
        sys.modules.pop(target, None)  # as under ``-m``: run as __main__ only
        runpy.run_module(target, run_name="__main__", alter_sys=True)
    elif kind == "-c":
        sys.path[0] = ""
        sys.argv = ["-c", *args]
        main = types.ModuleType("__main__")
        sys.modules["__main__"] = main
        exec(compile(target, "<string>", "exec"), main.__dict__)  # as python -c runs it
    else:
        sys.path[0] = os.path.dirname(os.path.abspath(target))
        sys.argv = [target, *args]
        runpy.run_path(target, run_name="__main__")


def _run_child(request: _Request, fds: list[int]) -> int:
    """In the forked child: become ``python ARGV`` and run it."""
    if request.new_session:
        os.setsid()
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    for signum in (signal.SIGCHLD, signal.SIGTERM, signal.SIGPIPE):
        signal.signal(signum, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    os.environ.clear()
    os.environ.update(request.env)
    os.chdir(request.cwd)
    try:
        _run(*program(request.argv), request.cwd)
    except SystemExit as stop:
        code = stop.code
        if code is None or isinstance(code, int):
            return code or 0
        print(code, file=sys.stderr)
        return 1
    return 0


class _Server:
    """The server's loop: accept requests, fork, report pids and exits."""

    def __init__(self, path: str) -> None:
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(path)
        self.listener.listen(64)
        self.selector = selectors.DefaultSelector()
        self.selector.register(self.listener, selectors.EVENT_READ, "accept")
        self.selector.register(sys.stdin, selectors.EVENT_READ, "parent")
        self.children: dict[int, tuple[socket.socket, int]] = {}  # pidfd -> (conn, pid)

    def serve(self) -> tuple[_Request, list[int]] | None:
        """Serve until the parent goes; in a forked child, return what it is to run."""
        while True:
            for key, _ in self.selector.select():
                if key.data == "parent":
                    if not os.read(sys.stdin.fileno(), 4096):
                        self._kill_children()
                        return None
                elif key.data == "accept":
                    conn, _ = self.listener.accept()
                    child = self._fork(conn)
                    if child is not None:
                        return child
                else:
                    self._reap(key.fd)

    def _fork(self, conn: socket.socket) -> tuple[_Request, list[int]] | None:
        fds = array.array("i")
        try:
            data, ancdata, _, _ = conn.recvmsg(1 << 16, socket.CMSG_SPACE(_FDS * fds.itemsize))
            for level, kind, payload in ancdata:
                if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                    fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
            while not data.endswith(b"\n"):  # the descriptors came with the first part
                more = conn.recv(1 << 16)
                if not more:
                    raise ValueError("the request was cut short")
                data += more
            spec = json.loads(data)
            request = _Request(
                [str(a) for a in spec["argv"]], spec["cwd"], dict(spec["env"]),
                bool(spec.get("new_session", False)),
            )  # fmt: skip
            program(request.argv)
            if len(fds) != _FDS:
                raise ValueError(f"{len(fds)} descriptors came with the request, not {_FDS}")
        except (OSError, ValueError, KeyError, TypeError) as exc:
            with contextlib.suppress(OSError):
                conn.sendall(f"error {exc}\n".encode())
            conn.close()
            for fd in fds:
                os.close(fd)
            return None
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            self.selector.close()
            self.listener.close()
            conn.close()
            for other, _ in self.children.values():
                other.close()
            for pidfd in self.children:
                os.close(pidfd)
            return request, list(fds)
        for fd in fds:
            os.close(fd)
        pidfd = os.pidfd_open(pid)
        self.children[pidfd] = (conn, pid)
        self.selector.register(pidfd, selectors.EVENT_READ, "child")
        with contextlib.suppress(OSError):
            conn.sendall(f"pid {pid}\n".encode())
        return None

    def _reap(self, pidfd: int) -> None:
        conn, pid = self.children.pop(pidfd)
        self.selector.unregister(pidfd)
        os.close(pidfd)
        _, status = os.waitpid(pid, 0)
        with contextlib.suppress(OSError):
            conn.sendall(f"exit {os.waitstatus_to_exitcode(status)}\n".encode())
        conn.close()

    def _kill_children(self) -> None:
        for _, pid in self.children.values():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for pidfd in list(self.children):
            self._reap(pidfd)


class _Child:
    """What both client shapes share: the child's pid, its status once
    known, and signals to it."""

    pid: int
    returncode: int | None

    def send_signal(self, signum: int) -> None:
        """Send ``signum`` to the child, unless it is known to have exited."""
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signum)

    def terminate(self) -> None:
        """``SIGTERM`` the child."""
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        """``SIGKILL`` the child."""
        self.send_signal(signal.SIGKILL)


class ForkedProcess(_Child):
    """A child of the fork server, awaited as an :class:`asyncio.subprocess.Process`."""

    def __init__(self, sock: socket.socket, pid: int, stdout: int | None, stderr: int | None):
        self.pid = pid
        self.returncode: int | None = None
        self._sock = sock
        self._pipes = {"stdout": stdout, "stderr": stderr}
        self.stdout: asyncio.StreamReader | None = None
        self.stderr: asyncio.StreamReader | None = None

    async def _attach(self) -> None:
        loop = asyncio.get_running_loop()
        for name, fd in self._pipes.items():
            if fd is None:
                continue
            reader = asyncio.StreamReader()
            pipe = os.fdopen(fd, "rb", buffering=0)
            await loop.connect_read_pipe(
                functools.partial(asyncio.StreamReaderProtocol, reader), pipe
            )
            setattr(self, name, reader)
        self._sock.setblocking(False)
        self._exit = loop.create_task(self._read_exit())

    async def _read_exit(self) -> int:
        loop = asyncio.get_running_loop()
        line = b""
        while not line.endswith(b"\n"):
            chunk = await loop.sock_recv(self._sock, 64)
            if not chunk:
                break
            line += chunk
        self._sock.close()
        self.returncode = _exit_code(line, self.pid)
        return self.returncode

    async def wait(self) -> int:
        """Wait for the child to exit; its exit status."""
        return await asyncio.shield(self._exit)

    async def communicate(self, input: bytes | None = None) -> tuple[bytes, bytes]:
        """Read stdout and stderr to their end, then wait; both outputs."""
        if input is not None:
            raise ValueError("a forked child's stdin is /dev/null")

        async def drain(reader: asyncio.StreamReader | None) -> bytes:
            return b"" if reader is None else await reader.read()

        out, err = await asyncio.gather(drain(self.stdout), drain(self.stderr))
        await self.wait()
        return out, err


class ForkedPopen(_Child):
    """A child of the fork server, used as a text-mode :class:`subprocess.Popen`."""

    def __init__(
        self, sock: socket.socket, pid: int, stdout: int | None, stderr: int | None,
        stdin: int | None = None,
    ) -> None:  # fmt: skip
        self.pid = pid
        self.returncode: int | None = None
        self._sock = sock
        self._line = b""
        self.stdin: IO[str] | None = None if stdin is None else os.fdopen(stdin, "w")
        self.stdout: IO[str] | None = None if stdout is None else os.fdopen(stdout, "r")
        self.stderr: IO[str] | None = None if stderr is None else os.fdopen(stderr, "r")

    def _read_exit(self, timeout: float | None) -> bool:
        """Read what the server sent of the exit line; whether it came whole."""
        self._sock.settimeout(timeout)
        while not self._line.endswith(b"\n"):
            try:
                chunk = self._sock.recv(64)
            except (BlockingIOError, TimeoutError):  # 0: non-blocking; else timed out
                return False
            if not chunk:
                break
            self._line += chunk
        self._sock.close()
        self.returncode = _exit_code(self._line, self.pid)
        return True

    def poll(self) -> int | None:
        """The exit status if the child has exited, else None (never blocks)."""
        if self.returncode is None:
            self._read_exit(0.0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the child to exit; its exit status.

        Raises :class:`subprocess.TimeoutExpired` after ``timeout`` seconds."""
        if self.returncode is None and not self._read_exit(timeout):
            raise subprocess.TimeoutExpired([str(self.pid)], timeout or 0.0)
        assert self.returncode is not None
        return self.returncode

    def communicate(self, timeout: float | None = None) -> tuple[str, str]:
        """Close stdin, read stdout and stderr to their end (both at once: a
        full pipe never stalls the other), then wait; both outputs.

        Raises :class:`subprocess.TimeoutExpired` after ``timeout`` seconds."""
        if self.stdin is not None and not self.stdin.closed:
            self.stdin.close()
        deadline = None if timeout is None else time.monotonic() + timeout
        read: dict[str, str] = {}

        def drain(name: str, pipe: IO[str] | None) -> None:
            read[name] = pipe.read() if pipe is not None else ""

        readers = [
            threading.Thread(target=drain, args=(name, pipe), daemon=True)
            for name, pipe in (("out", self.stdout), ("err", self.stderr))
        ]
        for reader in readers:
            reader.start()
        for reader in readers:
            reader.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
            if reader.is_alive():
                raise subprocess.TimeoutExpired([str(self.pid)], timeout or 0.0)
        self.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return read["out"], read["err"]


def _exit_code(line: bytes, pid: int) -> int:
    words = line.split()
    if len(words) != 2 or words[0] != b"exit":
        raise LabError(f"the fork server lost child {pid} (it said {line!r})")
    return int(words[1])


class ForkServer:
    """A running fork server and the modules it preloaded."""

    def __init__(self, proc: subprocess.Popen[bytes], path: str, preload: Sequence[str]) -> None:
        self._proc = proc
        self._path = path
        self.preload = tuple(preload)
        self._env = dict(os.environ)
        self._ready = False

    @classmethod
    def start(
        cls, preload: Sequence[str], *, cwd: str | None = None, wait: bool = True
    ) -> ForkServer:
        """Start a server that imports ``preload``; with ``wait``, block until
        it did, else the first request does (the imports run meanwhile)."""
        path = os.path.join(tempfile.mkdtemp(prefix="aiordma-forks-"), "socket")
        proc = subprocess.Popen(
            [sys.executable, "-m", "aiordma.lab.forkserver", path, *preload],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=cwd,
        )  # fmt: skip
        server = cls(proc, path, preload)
        if wait:
            server.wait_ready()
        return server

    def wait_ready(self) -> None:
        """Block until the server has imported its modules and listens.

        Raises :class:`LabError` if it failed to (a preload that does not import)."""
        if self._ready:
            return
        assert self._proc.stdout is not None
        line = self._proc.stdout.readline()
        self._proc.stdout.close()  # it says nothing more
        if line.strip() != b"ready":
            self._proc.kill()
            self._proc.wait()
            raise LabError(f"the fork server did not start (it said {line!r})")
        self._ready = True

    def is_ready(self) -> bool:
        """Whether the server has imported its modules (never blocks; a
        server that failed to start raises as :meth:`wait_ready` does)."""
        if not self._ready:
            assert self._proc.stdout is not None
            readable, _, _ = select.select([self._proc.stdout], [], [], 0)
            if readable:
                self.wait_ready()
        return self._ready

    def can_run(self, argv: Sequence[str], env: Mapping[str, str] | None = None) -> bool:
        """Whether a fork of this server is a faithful ``python ARGV`` in ``env``
        (``os.environ`` if None)."""
        if self._proc.poll() is not None:
            return False
        try:
            program(argv)
        except ValueError:
            return False
        if env is None:
            env = os.environ
        keys = set(env) | set(self._env)
        read_early = {k for k in keys if k.startswith("PYTHON") or k in IMPORT_TIME}
        return all(env.get(k) == self._env.get(k) for k in read_early)

    def _request(
        self, argv: Sequence[str], cwd: str | None, env: Mapping[str, str] | None,
        stdout: int | None, stderr: int | None, new_session: bool = False,
        stdin: int | None = None,
    ) -> tuple[socket.socket, int, int | None, int | None, int | None]:  # fmt: skip
        argv = [str(a) for a in argv]
        program(argv)
        sys.audit("aiordma.lab.forkserver.spawn", tuple(argv))
        if self._proc.poll() is not None:
            raise LabError(
                f"the fork server has exited ({self._proc.returncode}): start {argv} afresh"
            )
        self.wait_ready()
        ours: dict[str, int | None] = {"stdin": None}
        if stdin == subprocess.PIPE:
            theirs_in, ours["stdin"] = os.pipe()
        else:
            theirs_in = os.open(os.devnull, os.O_RDONLY)
        theirs: list[int] = [theirs_in]
        closing = list(theirs)
        for name, how in (("stdout", stdout), ("stderr", stderr)):
            if how == subprocess.PIPE:
                read, write = os.pipe()
                ours[name] = read
                theirs.append(write)
                closing.append(write)
            elif how == subprocess.STDOUT and name == "stderr":
                ours[name] = None
                theirs.append(theirs[1])
            elif how == subprocess.DEVNULL:
                ours[name] = None
                fd = os.open(os.devnull, os.O_WRONLY)
                theirs.append(fd)
                closing.append(fd)
            elif how is not None and how >= 0:
                ours[name] = None
                theirs.append(how)  # a descriptor of the caller's, as Popen takes one
            else:
                ours[name] = None
                theirs.append(1 if name == "stdout" else 2)  # inherited, as Popen's None
        spec = {
            "argv": argv,
            "cwd": os.path.abspath(cwd or os.getcwd()),
            "env": dict(os.environ if env is None else env),
            "new_session": new_session,
        }
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(self._path)
            fds = array.array("i", theirs)
            request = json.dumps(spec).encode() + b"\n"
            sent = sock.sendmsg([request], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)])
            sock.sendall(request[sent:])  # a stream may take a long request in parts
            line = sock.makefile("rb").readline()
            if not line.startswith(b"pid "):
                raise LabError(f"the fork server refused {argv}: {line.decode().strip()}")
        except BaseException:
            sock.close()
            for mine in ours.values():
                if mine is not None:
                    os.close(mine)
            raise
        finally:
            for fd in closing:
                os.close(fd)
        return sock, int(line.split()[1]), ours["stdout"], ours["stderr"], ours["stdin"]

    async def spawn(
        self, *argv: str, cwd: str | None = None,
        env: Mapping[str, str] | None = None, stdout: int | None = None,
        stderr: int | None = None,
    ) -> ForkedProcess:  # fmt: skip
        """``asyncio.create_subprocess_exec(python, *argv, ...)``, forked (its
        stdin /dev/null)."""
        sock, pid, out, err, _ = self._request(argv, cwd, env, stdout, stderr)
        proc = ForkedProcess(sock, pid, out, err)
        await proc._attach()
        return proc

    def popen(
        self, *argv: str, cwd: str | None = None,
        env: Mapping[str, str] | None = None, stdout: int | None = None,
        stderr: int | None = None, start_new_session: bool = False,
        stdin: int | None = None,
    ) -> ForkedPopen:  # fmt: skip
        """``subprocess.Popen([python, *argv], text=True, ...)``, forked.

        ``stdout`` and ``stderr`` take what Popen's do (``PIPE``, ``STDOUT``,
        ``DEVNULL``, a descriptor, None); ``stdin`` is ``PIPE`` (written
        through :attr:`ForkedPopen.stdin`) or else /dev/null."""
        sock, pid, out, err, into = self._request(
            argv, cwd, env, stdout, stderr, start_new_session, stdin
        )
        return ForkedPopen(sock, pid, out, err, into)

    def close(self) -> None:
        """Stop the server (its children that still run are killed)."""
        if not self._ready:
            self._proc.kill()  # still importing, so no children yet: no need to wait
        if self._proc.stdin is not None:
            self._proc.stdin.close()
        self._proc.wait()
        if self._proc.stdout is not None:
            self._proc.stdout.close()  # closed by wait_ready unless never ready
        with contextlib.suppress(OSError):
            os.unlink(self._path)
            os.rmdir(os.path.dirname(self._path))


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args:
        print("usage: python -m aiordma.lab.forkserver SOCKET [MODULE...]", file=sys.stderr)
        return 2
    path, preload = args[0], args[1:]
    for module in preload:
        importlib.import_module(module)
    server = _Server(path)
    print("ready", flush=True)
    child = server.serve()
    if child is None:
        return 0
    return _run_child(*child)


if __name__ == "__main__":
    raise SystemExit(main())
