"""Facts the documentation states, checked against the code (host only)."""

from __future__ import annotations

import re
from pathlib import Path

import aiordma
from aiordma import rpc
from aiordma.cm import _rdmacm, auth

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
GUIDES = {
    name
    for path in (DOCS / "guides").glob("*.md")
    for name in (path.stem, path.stem.replace("-", " "))
}


def _python_sources() -> list[Path]:
    return sorted((ROOT / "aiordma").rglob("*.py"))


def test_every_guide_a_docstring_or_page_cites_exists() -> None:
    cited: dict[str, set[str]] = {}
    pattern = re.compile(r"\bthe ([a-z][a-z -]*?) guide\b")
    for path in [*_python_sources(), *DOCS.rglob("*.md")]:
        text = " ".join(path.read_text().split())  # a citation may span lines
        for name in pattern.findall(text):
            cited.setdefault(name, set()).add(str(path.relative_to(ROOT)))
    missing = {name: where for name, where in cited.items() if name not in GUIDES}
    assert not missing, f"guides cited but not written: {missing}"


def test_the_tutorial_gives_a_remote_buffers_real_size() -> None:
    text = (DOCS / "tutorial.md").read_text()
    stated = {int(n) for n in re.findall(r"RemoteBuffer\.SIZE \((\d+)\) bytes", text)}
    assert stated == {aiordma.RemoteBuffer.SIZE}
    assert "16 bytes" not in text


def test_memory_windows_are_not_promised_for_later() -> None:
    for page in ("guides/performance.md", "design.md"):
        text = " ".join((DOCS / page).read_text().split())
        assert "later release" not in text, page
        assert "once pyverbs and rxe are shown to support them" not in text, page


def test_rpc_connect_states_the_private_data_it_leaves_free() -> None:
    doc = " ".join((rpc.connect.__doc__ or "").split())
    free = _rdmacm.MAX_CONNECT_DATA
    assert f"at most {free} bytes, {free - auth.REQUEST_SIZE} with ``auth``" in doc
