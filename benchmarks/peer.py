"""The peer process of a study: the study's own module run again with ``--serve``."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import AsyncIterator
from typing import Any


class StudyPeer:
    """The peer of a study (:mod:`benchmarks.studies`): the study's own
    module run again as a child process with ``--serve``.

    The child prints one JSON line once it listens (:attr:`hello`: its
    ports, say), answers each line written to it with one JSON line
    (:meth:`ask`), and stops when its input ends (:meth:`stop`, or leaving
    ``async with``); :func:`requests` is the child's side of that.
    """

    def __init__(self, process: asyncio.subprocess.Process, hello: Any) -> None:
        self.process = process
        self.hello = hello

    @classmethod
    async def start(cls, module: str, *argv: str) -> StudyPeer:
        """Run ``python -m module --serve ARGV...`` and wait for its first line."""
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", module, "--serve", *argv,
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )  # fmt: skip
        assert process.stdout is not None
        line = await process.stdout.readline()
        if not line:
            await process.wait()
            raise RuntimeError(f"the peer of {module} exited ({process.returncode}) unannounced")
        return cls(process, json.loads(line))

    async def ask(self, request: str) -> Any:
        """Write ``request`` as a line; the child's one-line JSON answer."""
        stdin, stdout = self.process.stdin, self.process.stdout
        assert stdin is not None
        assert stdout is not None
        stdin.write(request.encode() + b"\n")
        await stdin.drain()
        return json.loads(await stdout.readline())

    async def stop(self) -> None:
        """End the child's input and wait for it to exit."""
        assert self.process.stdin is not None
        if not self.process.stdin.is_closing():
            self.process.stdin.close()
        await self.process.wait()

    async def __aenter__(self) -> StudyPeer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()


async def requests(hello: Any) -> AsyncIterator[str]:
    """The child's side of :class:`StudyPeer`: print ``hello`` as one JSON
    line, then yield each line the study writes, until its input ends. Each
    request is answered with :func:`answer`."""
    answer(hello)
    loop = asyncio.get_running_loop()
    while line := await loop.run_in_executor(None, sys.stdin.readline):
        yield line.strip()


def answer(value: Any) -> None:
    """Send the study one JSON line."""
    print(json.dumps(value), flush=True)
