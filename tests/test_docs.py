"""Every ```python block of README.md and docs/*.md runs (blocks of one page share a namespace)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.usefixtures("collect_pipelines")

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_code_blocks_run(page: Path) -> None:
    blocks = BLOCK.findall(page.read_text(encoding="utf-8"))
    assert blocks, f"{page} has no python code block"
    namespace: dict[str, object] = {"__name__": f"docs_{page.stem}"}
    for i, code in enumerate(blocks):
        exec(compile(code, f"{page.name}[block {i}]", "exec"), namespace)
    for value in list(namespace.values()):
        close = getattr(value, "close", None)
        if callable(close) and type(value).__name__.endswith("Storage"):
            close()
