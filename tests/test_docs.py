"""Every ```python block of README.md and docs/*.md runs (blocks of one page share a namespace).

And the README's figures that the code can count are the code's.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections import Counter
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


def test_the_readme_counts_the_datasets_that_datasets_list_lists() -> None:
    """The README's id counts per family are what ``rbdata datasets list`` prints."""
    out = subprocess.run(
        [sys.executable, "-m", "rbdata", "datasets", "list"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        check=True,
    ).stdout
    listed = Counter(line.split("/")[0] for line in out.splitlines() if "/" in line.split(" ")[0])
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for name, family in (("D4RL", "d4rl"), ("OGBench", "ogbench"), ("AtariDQN", "atari-dqn")):
        found = re.search(rf"`rbdata\.datasets\.{name}` \((\d+) ids", readme)
        assert found, f"the README gives no id count for {name}"
        assert int(found.group(1)) == listed[family], (name, found.group(1), listed[family])
