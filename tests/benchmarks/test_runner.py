"""``python -m benchmarks``: the studies listed, an unknown one refused (no device)."""

from __future__ import annotations

import pytest

import benchmarks
from benchmarks.__main__ import main


def test_the_runner_lists_the_studies_and_refuses_an_unknown_one(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert "load_scenarios" in benchmarks.names()
    assert main([]) == 2
    assert "load_scenarios" in capsys.readouterr().out
    assert main(["no_such_study"]) == 2
    assert "no study 'no_such_study'" in capsys.readouterr().err


def test_nothing_under_the_library_is_a_study() -> None:
    import aiordma.bench

    assert not hasattr(aiordma.bench, "studies")
    with pytest.raises(ModuleNotFoundError):
        __import__("aiordma.bench.studies")
