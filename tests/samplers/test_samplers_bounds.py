"""Bounds of the sampler kernels (sum trees, slice tables): a slot or draw outside them is refused.

Crash tests run the risky call in a child process and assert on its exit code: on the code
before these fixes they die with SIGSEGV (or corrupt memory silently).
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from _child import run_child

from rbdata.samplers import _slices

CRASH_SECTIONS = {
    # a plain Sized source has no capacity: it is checked by len at construction, then grows
    "growing_source": """
        from rbdata import PrioritizedSampler
        source = list(range(8))
        sampler = PrioritizedSampler(8, 0.6, 0.4, data_source=source)
        source.extend(range(200_000))
        for index in (torch.arange(200_000), list(range(200_000))):
            try:
                sampler.update_priority(index, 1.0)
            except ValueError as err:
                print("refused:", err)
        print("total", float(sampler.priority_values().sum()))
    """,
    "sumtree_update": """
        from rbdata.samplers._trees import sumtree as _sumtree
        tree = _sumtree.new_tree(10, "sum")
        for index, values in (
            (torch.tensor([10**9]), torch.tensor([1.0])),
            (torch.tensor([-(10**9)]), torch.tensor([1.0])),
            (torch.tensor([0, 1, 2]), torch.tensor([1.0])),
            (torch.tensor([[0]]), torch.tensor([1.0])),
        ):
            try:
                _sumtree.update(tree, index, values, "sum")
                print("accepted")
            except (IndexError, ValueError) as err:
                print(type(err).__name__, err)
        print("root", float(tree[_sumtree.ROOT]))
    """,
    "slice_draw": """
        from rbdata.samplers import _slices
        cumsum, shift, stops = _slices.segments(torch.tensor([4]).numpy(), 10, 100, 3, True)
        for r in (torch.tensor([0, 10**9]), torch.tensor([-(10**9)]), torch.tensor([6])):
            try:
                _slices.draw(cumsum, shift, stops, r, 3, 0, 100, True)
                print("accepted")
            except ValueError as err:
                print(err)
        print(_slices.draw(cumsum, shift, stops, torch.tensor([5]), 3, 0, 100, True)[0].tolist())
    """,
}


@pytest.fixture(scope="module")
def crash_sections() -> tuple[int, str, dict[str, list[str]]]:
    """Run every section in one child; return its exit code, stderr and each section's lines.

    A section that crashes the child leaves that section and the later ones without output.
    """
    code = "import torch\n" + "".join(
        f"print('### {name}', flush=True)\n" + textwrap.dedent(body)
        for name, body in CRASH_SECTIONS.items()
    )
    result = run_child(code)
    out: dict[str, list[str]] = {}
    current: list[str] = []
    for line in result.stdout.splitlines():
        if line.startswith("### "):
            current = out.setdefault(line[4:], [])
        else:
            current.append(line)
    return result.returncode, result.stderr, out


def test_update_priority_past_capacity_with_a_growing_source_does_not_crash(
    crash_sections: tuple[int, str, dict[str, list[str]]],
) -> None:
    returncode, stderr, out = crash_sections
    assert returncode == 0, stderr[-2000:]
    assert out["growing_source"] == [
        "refused: index: 8 is outside the filled range [0, 8)",
        "refused: index: 8 is outside the filled range [0, 8)",
        "total 0.0",  # nothing was written
    ]


def test_sumtree_update_checks_slots_and_lengths_before_the_kernel(
    crash_sections: tuple[int, str, dict[str, list[str]]],
) -> None:
    returncode, stderr, out = crash_sections
    assert returncode == 0, stderr[-2000:]
    assert out["sumtree_update"] == [
        "IndexError index 1000000000 is out of range for a tree of 64 slots",
        "IndexError index -1000000000 is out of range for a tree of 64 slots",
        "ValueError values: expected 3 values (one per index), got 1",
        "ValueError index: expected a 1-D integer tensor, got torch.int64 (1, 1)",
        "root 0.0",
    ]


def test_slice_draw_refuses_draws_outside_the_tables(
    crash_sections: tuple[int, str, dict[str, list[str]]],
) -> None:
    returncode, stderr, out = crash_sections
    assert returncode == 0, stderr[-2000:]
    assert out["slice_draw"] == [
        "r: draw 1000000000 is outside [0, 6), the number of slice starts",
        "r: draw -1000000000 is outside [0, 6), the number of slice starts",
        "r: draw 6 is outside [0, 6), the number of slice starts",
        "[7, 8, 9]",
    ]


def test_slice_draw_refuses_tables_of_different_lengths() -> None:
    cumsum, shift, stops = _slices.segments(np.array([4, 7]), 10, 100, 2, True)
    with pytest.raises(ValueError, match="one length"):
        _slices.draw(cumsum, shift[:1], stops, torch.tensor([0]), 2, 0, 100, True)


def test_numba_boundscheck_needs_its_own_cache_dir(tmp_path: Path) -> None:
    """The command line of the bounds-checked kernel run really checks bounds.

    numba's on-disk cache (``cache=True``) does not key on ``NUMBA_BOUNDSCHECK``: a kernel
    compiled without checks would be reused, so the run points ``NUMBA_CACHE_DIR`` at a
    directory of its own. A kernel called directly with a slot far past the tree must then
    raise ``IndexError`` instead of writing to a wild address.
    """
    code = """
        import numpy as np, torch
        from rbdata.samplers._trees import numba_kernels as _kernels
        from rbdata.samplers._trees import sumtree as _sumtree
        tree = _sumtree.new_tree(10, "sum", torch.float64)
        offsets = np.asarray(_sumtree.layout(tree), dtype=np.int64)
        try:
            _kernels._nb_update(
                tree.numpy(), offsets, np.array([10**9], np.int64), np.array([1.0]), True
            )
            print("unchecked")
        except IndexError as err:
            print("IndexError:", err)
    """
    env = {"NUMBA_BOUNDSCHECK": "1", "NUMBA_CACHE_DIR": str(tmp_path / "numba")}
    result = run_child(code, env)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "IndexError: index is out of bounds"
