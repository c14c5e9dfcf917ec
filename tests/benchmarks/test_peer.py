"""The peer process a study runs (host only: no device involved)."""

from __future__ import annotations

import pytest

from benchmarks.peer import StudyPeer


@pytest.mark.asyncio
@pytest.mark.both_loops("subprocess")
async def test_a_study_peer_announces_itself_answers_and_stops_with_its_input() -> None:
    async with await StudyPeer.start("tests.benchmarks.study_child", "a", "b") as child:
        assert child.hello == {"argv": ["a", "b"]}
        assert await child.ask("rss") == {"echo": "rss"}
        assert await child.ask("again") == {"echo": "again"}
    assert child.process.returncode == 0


@pytest.mark.asyncio
@pytest.mark.both_loops("subprocess")
async def test_a_study_peer_that_exits_unannounced_is_an_error() -> None:
    with pytest.raises(RuntimeError, match="exited"):
        await StudyPeer.start("aiordma.no_such_module")
