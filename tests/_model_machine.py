"""The stateful test's machine: hypothesis generates operation sequences, forked workers run them.

A :class:`hypothesis.stateful.RuleBasedStateMachine` per configuration draws operations from
the plain-Python model only (``_model.Model``: preconditions and valid ranges), so generating a
sequence never touches rbdata. At the end of each sequence (``teardown``) a worker process is
forked from this one (everything already imported) and runs the whole sequence against a real
buffer with ``_model_exec.Runner``, comparing it with the model after every step. A failed
comparison, an unexpected exception *or a crash of the worker* (a signal, e.g. SIGSEGV or
SIGABRT from a corrupted heap) is an ``AssertionError`` naming the step, so hypothesis shrinks
the sequence; then :func:`minimize` deletes the steps the same failure does not need (hypothesis
shrinks the values drawn well, but seldom deletes steps of a state machine). This process only
runs a short warm-up sequence itself (to compile the numba kernels once), so a crash in a
sequence cannot take it down.

Each sequence starts with ``layout(wide=...)``: the items' fields (see ``_model_exec.Data``).

Run by ``tests/test_model_based.py`` in a child interpreter::

    python -c "import _model_machine; _model_machine.main()" --configs tensor-uniform-round_robin \\
        --examples 8 --steps 20 --out results.json

and, to replay a reported sequence (in this process, with tracebacks)::

    python tests/_model_machine.py --replay tensor-uniform-round_robin '[{"op": "extend", ...}]'
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import io
import json
import os
import select
import shutil
import signal
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import hypothesis.strategies as st
import torch
from _model import (
    CAP,
    CONFIGS,
    PRIORITIES,
    SLICE_LEN,
    Config,
    Model,
    bad_kinds,
)
from _model_exec import Runner, describe
from hypothesis import HealthCheck, Phase, Verbosity, seed, settings
from hypothesis.stateful import (
    RuleBasedStateMachine,
    get_state_machine_test,
    initialize,
    rule,
)

__all__ = ["main", "make_machine", "run_sequence"]

SEQUENCE_TIMEOUT = 240.0  # one worker: a sequence of steps (spawned DataLoaders included)


class Counters:
    """Sequences and steps run for one configuration (generation and shrinking alike)."""

    def __init__(self) -> None:
        self.sequences = 0
        self.steps = 0
        self.spawns = 0
        self.failures = 0
        self.last: tuple[list[dict[str, Any]], Failure] | None = None


# --- running a sequence ------------------------------------------------------------------------
def _execute(cfg: Config, ops: list[dict[str, Any]], root: Path, report: Any) -> None:
    """Run ``ops`` on a fresh buffer in this process (``report(k)`` before step ``k``)."""
    wide = bool(ops) and ops[0]["op"] == "layout" and ops[0]["wide"]
    runner = Runner(cfg, root, wide)
    try:
        runner.check()
        for k, op in enumerate(ops):
            report(k)
            runner.step(op)
    finally:
        with contextlib.suppress(Exception):
            runner.close()


def _listing(cfg: Config, ops: list[dict[str, Any]], failed: int | None) -> str:
    lines = [f"configuration {cfg.name} (capacity {CAP}); the sequence:"]
    for k, op in enumerate(ops):
        mark = ">>" if k == failed else "  "
        lines.append(f"{mark} {k:2d}. {describe(op)}")
    lines.append("replay it (tracebacks, in one process):")
    lines.append(f"  python tests/_model_machine.py --replay {cfg.name} '{json.dumps(ops)}'")
    return "\n".join(lines)


@dataclass
class Failure:
    """How a sequence failed: at which step, what kind of failure, and the full report."""

    step: int | None
    kind: str  # "crash SIGSEGV", "ModelError", "RuntimeError", ...
    text: str

    def signature(self, ops: list[dict[str, Any]]) -> tuple[str, str]:
        """What another sequence must reproduce to count as the same failure."""
        where = "set-up" if self.step is None else ops[self.step]["op"]
        return self.kind, where


def run_sequence(cfg: Config, ops: list[dict[str, Any]]) -> Failure | None:
    """Run ``ops`` in a forked worker; return ``None`` or how it failed.

    The worker writes ``step k`` before each step and its error at the end to a pipe; its
    stderr goes to a file whose tail is quoted if it dies (glibc prints heap corruption there).
    """
    root = Path(tempfile.mkdtemp(prefix="rbdata-model-"))
    read, write = os.pipe()
    err_file = root / "stderr"
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the worker
        code = 1
        try:
            os.close(read)
            fd = os.open(err_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            # the library's temporary directories too: removed with root, even after a crash
            (root / "tmp").mkdir()
            tempfile.tempdir = str(root / "tmp")

            def report(k: int) -> None:
                os.write(write, f"step {k}\n".encode())

            _execute(cfg, ops, root / "work", report)
            os.write(write, b"ok\n")
            code = 0
        except BaseException as err:
            text = "".join(traceback.format_exception_only(err)).strip()
            tb = "".join(traceback.format_exception(err))
            payload = json.dumps(
                {"error": text, "type": type(err).__name__, "traceback": tb[-6000:]}
            )
            with contextlib.suppress(OSError):
                os.write(write, b"error " + payload.encode() + b"\n")
        finally:
            os._exit(code)
    os.close(write)
    try:
        lines, status = _collect(pid, read)
        step: int | None = None
        error: dict[str, str] | None = None
        ok = False
        for line in lines:
            if line.startswith("step "):
                step = int(line[5:])
            elif line.startswith("error "):
                error = json.loads(line[6:])
            elif line == "ok":
                ok = True
        if ok and status == 0:
            return None
        stderr = err_file.read_text(errors="replace")[-3000:] if err_file.exists() else ""
        where = "set-up" if step is None else f"step {step} ({describe(ops[step])})"
        if error is not None:
            kind = error.get("type", "error")
            head = f"{where} failed: {error['error']}"
            detail = error["traceback"]
        elif os.WIFSIGNALED(status):
            kind = f"crash {signal.Signals(os.WTERMSIG(status)).name}"
            head = f"the worker CRASHED at {where}: killed by {kind[6:]}"
            detail = ""
        else:
            kind = f"exit {status}"
            head = f"the worker died at {where}: exit status {status}"
            detail = ""
        parts = [head, _listing(cfg, ops, step)]
        if detail:
            parts.append("traceback:\n" + detail)
        if stderr.strip():
            parts.append("worker stderr (tail):\n" + stderr)
        return Failure(step, kind, "\n".join(parts))
    finally:
        shutil.rmtree(root, ignore_errors=True)


def valid(cfg: Config, ops: list[dict[str, Any]]) -> bool:
    """Whether the machine could have generated ``ops`` (the same preconditions and ranges)."""
    model = Model(cfg, track=False)
    try:
        for k, op in enumerate(ops):
            if not (k == 0 and op["op"] == "layout") and not _allowed(cfg, model, op):
                return False
            model.apply(op)
    except (AssertionError, IndexError, KeyError, ValueError):
        return False
    return True


def _allowed(cfg: Config, model: Model, op: dict[str, Any]) -> bool:
    kind, n = op["op"], len(model)
    if kind == "layout":
        return False  # only as the first operation (kept by minimize)
    if kind == "set":
        slots = op["slots"]
        top = max(slots) + 1
        grows = top > n
        holes = grows and sorted(s for s in slots if s >= n) != list(range(n, top))
        negative = op["form"] in ("neg_int", "neg_slice")
        return not (holes or (grows and (negative or cfg.sampler == "prioritized")))
    if kind == "update_priority":
        return bool(n) and max(op["index"]) < n
    if kind in ("iterate", "dataloader"):
        return model.sampleable()
    if kind == "loads":
        return model.ckpt is not None
    if kind == "reopen":
        return model.reopenable
    if kind == "share":
        return cfg.storage == "memmap" or (cfg.storage == "tensor" and model.layout)
    if kind == "move_while_writing":
        return model.refusal({"op": "add"}) is None
    if kind == "open_elsewhere":
        joins = model.opener_can_join()
        if joins is None or cfg.writer != "round_robin":
            return False
        return not joins or model.refusal({"op": "extend", "n": len(op["ranks"])}) is None
    if kind == "bad":
        return op["kind"] in bad_kinds(model)
    return True


def minimize(
    cfg: Config, ops: list[dict[str, Any]], failure: Failure, budget: float
) -> tuple[list[dict[str, Any]], Failure, int]:
    """Delete steps while the same failure (kind, and operation of the failing step) remains.

    Hypothesis shrinks the values drawn well but rarely deletes steps of a state machine;
    this pass (one worker per candidate, within ``budget`` seconds) leaves a sequence from
    which no single step can be removed. Returns it, its failure and the candidates tried.
    """
    deadline = time.monotonic() + budget
    sig = failure.signature(ops)
    shown = ops  # the sequence failure.text lists
    if failure.step is not None:
        ops = ops[: failure.step + 1]
    tried, changed = 0, True
    while changed and time.monotonic() < deadline:
        changed = False
        i = len(ops) - 1
        while i >= 1 and time.monotonic() < deadline:  # (step 0: the layout)
            cand = ops[:i] + ops[i + 1 :]
            if cand and valid(cfg, cand):
                tried += 1
                got = run_sequence(cfg, cand)
                if got is not None and got.signature(cand) == sig:
                    ops, shown, failure, changed = cand, cand, got, True
                    if got.step is not None:
                        ops = ops[: got.step + 1]
                    i = min(i, len(ops))
            i -= 1
    if shown != ops:  # the report of the truncated sequence itself
        got = run_sequence(cfg, ops)
        if got is not None and got.signature(ops) == sig:
            failure = got
    return ops, failure, tried


def _collect(pid: int, fd: int) -> tuple[list[str], int]:
    buf, deadline = b"", time.monotonic() + SEQUENCE_TIMEOUT
    try:
        while True:
            left = deadline - time.monotonic()
            ready, _, _ = select.select([fd], [], [], max(0.0, left))
            if not ready:
                os.kill(pid, signal.SIGKILL)
                buf += (
                    b"error "
                    + json.dumps(
                        {"error": f"timed out after {SEQUENCE_TIMEOUT:.0f} s", "traceback": ""}
                    ).encode()
                )
                break
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            buf += chunk
    finally:
        os.close(fd)
    _, status = os.waitpid(pid, 0)
    return buf.decode(errors="replace").splitlines(), status


# --- the machine -----------------------------------------------------------------------------
#: how often each operation is drawn (relative weights; writes and bad inputs most)
WEIGHTS = [
    ("extend", 14),
    ("add", 14),
    ("set", 7),
    ("sample", 8),
    ("update_priority", 8),
    ("bad", 12),
    ("iterate", 4),
    ("dataloader", 4),
    ("pickle", 6),
    ("fork_read", 3),
    ("share", 2),
    ("dumps", 4),
    ("loads", 4),
    ("state_dict", 4),
    ("reopen", 3),
    ("move_while_writing", 2),
    ("open_elsewhere", 2),
]


def make_machine(
    cfg: Config, spawn: bool, counters: Counters, avoid: frozenset[str] = frozenset()
) -> type[RuleBasedStateMachine]:
    """The state machine of configuration ``cfg`` (``spawn``: DataLoaders may spawn workers).

    ``avoid`` names reported findings whose trigger is not generated (to look past them):
    ``list-aliasing`` (a ListStorage's input is not overwritten after the write),
    ``arrow-ragged-aliasing`` (nor an ArrowStorage's with a ragged key),
    ``list-numpy-first`` (a ListStorage's first write is not an item of numpy arrays or
    Python numbers), ``shared-set`` (no ``storage.set`` once a MemmapStorage is shared),
    ``arrow-items`` (no list-of-items batches on an ArrowStorage), ``slice-dumps-no-end``
    (no ``dumps`` while a SliceSampler indexes no episode end), ``torch-save-after-loads``
    (no ``torch.save`` of a state dict once the buffer was loaded from a checkpoint),
    ``pickle`` (no pickling and no spawned DataLoader).
    """
    strings = cfg.strings
    is_list = cfg.storage == "list"
    no_clobber = (
        is_list and "list-aliasing" in avoid,
        strings and "arrow-ragged-aliasing" in avoid,
    )
    pickles = "pickle" not in avoid
    batch_forms = ["dict", "items"] if strings else ["td", "dict", "items"]
    if cfg.storage == "arrow" and "arrow-items" in avoid:
        batch_forms.remove("items")
    shared_set = "shared-set" not in avoid
    slice_dumps = cfg.sampler != "slice" or "slice-dumps-no-end" not in avoid
    save_after_loads = "torch-save-after-loads" not in avoid
    all_item_forms = ["numpy", "python", "tensor"] + ([] if strings else ["td"])
    numpy_first = not (is_list and "list-numpy-first" in avoid)
    prioritized = cfg.sampler == "prioritized"
    max_n = CAP + 2 if cfg.writer == "max_value" else CAP
    ranks = st.integers(0, 3).map(float)

    # (kind, weight, enabled): each step draws a kind among the enabled ones, by weight;
    # writes come first, so that shrinking (towards the first kind) keeps sequences useful
    def enabled(m: Model) -> list[str]:
        can = {
            "extend": True,
            "add": True,
            "set": (bool(m.items) or not prioritized) and (shared_set or not m.shared),
            "sample": True,
            "update_priority": prioritized and bool(m.items),
            "bad": True,
            "iterate": m.sampleable(),
            "dataloader": m.sampleable(),
            "pickle": pickles,
            "fork_read": True,
            "share": cfg.storage == "memmap" or (cfg.storage == "tensor" and m.layout),
            "dumps": slice_dumps or bool(m.ends),
            "loads": m.ckpt is not None,
            "state_dict": True,
            "reopen": m.reopenable,
            "move_while_writing": pickles and m.refusal({"op": "add"}) is None,
            "open_elsewhere": cfg.writer == "round_robin" and m.opener_can_join() is not None,
        }
        return [kind for kind, weight in WEIGHTS for _ in range(weight) if can[kind]]

    class Machine(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.model = Model(cfg, track=False)
            self.ops: list[dict[str, Any]] = []

        @initialize(wide=st.booleans())
        def layout(self, wide: bool) -> None:
            self.ops.append({"op": "layout", "wide": wide})
            self.wide = wide

        def clobbers(self) -> st.SearchStrategy[bool]:
            """Whether inputs may be overwritten after a write (catches aliasing)."""
            if no_clobber[0] or (no_clobber[1] and self.wide):
                return st.just(False)
            return st.booleans()

        def item_forms(self) -> list[str]:
            if self.model.layout or numpy_first:
                return all_item_forms
            return [f for f in all_item_forms if f not in ("numpy", "python")]

        @rule(data=st.data())
        def step(self, data: Any) -> None:
            kind = data.draw(st.sampled_from(enabled(self.model)), label="operation")
            op = getattr(self, "draw_" + kind)(data)
            if op is not None:
                self.model.apply(op)
                self.ops.append(op)

        def draw_extend(self, data: Any) -> dict[str, Any]:
            n = data.draw(st.integers(1, max_n), label="n")
            return {
                "op": "extend",
                "n": n,
                "ranks": data.draw(st.lists(ranks, min_size=n, max_size=n)),
                "dones": data.draw(st.lists(st.booleans(), min_size=n, max_size=n)),
                "form": data.draw(st.sampled_from(batch_forms)),
                "clobber": data.draw(self.clobbers()),
            }

        def draw_add(self, data: Any) -> dict[str, Any]:
            return {
                "op": "add",
                "rank": data.draw(ranks),
                "done": data.draw(st.booleans()),
                "form": data.draw(st.sampled_from(self.item_forms())),
                "clobber": data.draw(self.clobbers()),
            }

        def draw_set(self, data: Any) -> dict[str, Any] | None:
            n = len(self.model)
            # appending past len is allowed where no sampler priority is left undefined
            room = 0 if prioritized else min(2, CAP - n)
            forms = ["int", "slice", "list", "tensor"]
            if n:
                forms += ["neg_int", "neg_slice"]
            form = data.draw(st.sampled_from(forms))
            if form in ("int", "neg_int"):
                hi = n + min(room, 1) if form == "int" else n
                slots = [data.draw(st.integers(0, hi - 1))]
            elif form in ("slice", "neg_slice"):
                top = n + room if form == "slice" else n
                a = data.draw(st.integers(0, top - 1))
                b = data.draw(st.integers(a + 1, top))
                a = min(a, n)  # no holes: a run past len starts at len at the latest
                slots = list(range(a, b))
            else:
                old = data.draw(st.lists(st.integers(0, max(n - 1, 0)), unique=True)) if n else []
                extra = data.draw(st.integers(0 if old else 1, room)) if room else 0
                slots = list(data.draw(st.permutations(old + list(range(n, n + extra)))))
            if not slots:
                return None
            k = len(slots)
            single = form in ("int", "neg_int")
            return {
                "op": "set",
                "form": form,
                "slots": slots,
                "ranks": data.draw(st.lists(ranks, min_size=k, max_size=k)),
                "dones": data.draw(st.lists(st.booleans(), min_size=k, max_size=k)),
                "dform": data.draw(st.sampled_from(self.item_forms() if single else batch_forms)),
                "clobber": data.draw(self.clobbers()),
            }

        def draw_sample(self, data: Any) -> dict[str, Any]:
            if cfg.sampler == "slice":
                bs = SLICE_LEN * data.draw(st.integers(1, 4))
            else:
                bs = data.draw(st.integers(1, CAP + 1))
            return {"op": "sample", "bs": bs}

        def draw_update_priority(self, data: Any) -> dict[str, Any]:
            n = len(self.model)
            index = data.draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=4))
            k = len(index)
            prio: Any = data.draw(st.lists(st.sampled_from(PRIORITIES), min_size=k, max_size=k))
            pform = data.draw(st.sampled_from(["list", "numpy", "tensor32", "tensor64", "scalar"]))
            if pform == "scalar":
                prio = prio[0]
            iform = data.draw(st.sampled_from(["list", "numpy", "tensor"]))
            return {
                "op": "update_priority",
                "index": index,
                "prio": prio,
                "iform": iform,
                "pform": pform,
            }

        def draw_iterate(self, data: Any) -> dict[str, Any]:
            if cfg.sampler == "without":
                batches = data.draw(st.sampled_from([None, 1, 2]))
            else:
                batches = data.draw(st.integers(1, 3))
            return {"op": "iterate", "batches": batches}

        def draw_pickle(self, data: Any) -> dict[str, Any]:
            target = data.draw(st.sampled_from(["storage", "buffer"]))
            return {"op": "pickle", "target": target, "load": data.draw(st.booleans())}

        def draw_fork_read(self, data: Any) -> dict[str, Any]:
            return {"op": "fork_read"}

        def draw_share(self, data: Any) -> dict[str, Any]:
            return {"op": "share"}

        def draw_move_while_writing(self, data: Any) -> dict[str, Any]:
            n = data.draw(st.integers(1, CAP), label="n")
            return {
                "op": "move_while_writing",
                "ranks": data.draw(st.lists(ranks, min_size=n, max_size=n)),
                "dones": data.draw(st.lists(st.booleans(), min_size=n, max_size=n)),
            }

        def draw_open_elsewhere(self, data: Any) -> dict[str, Any] | None:
            n = data.draw(st.integers(1, CAP), label="n")
            if self.model.opener_can_join() and self.model.refusal({"op": "extend", "n": n}):
                return None  # its write would not continue the slice sampler's time order
            return {
                "op": "open_elsewhere",
                "ranks": data.draw(st.lists(ranks, min_size=n, max_size=n)),
                "dones": data.draw(st.lists(st.booleans(), min_size=n, max_size=n)),
            }

        def draw_dataloader(self, data: Any) -> dict[str, Any]:
            # spawned workers cost seconds: at most one such epoch per sequence
            spawned = any(op["op"] == "dataloader" and op["workers"] for op in self.ops)
            can = spawn and pickles and not spawned
            workers = data.draw(st.sampled_from([0, 2] if can else [0]))
            return {
                "op": "dataloader",
                "workers": workers,
                "bs": SLICE_LEN * data.draw(st.integers(1, 2)),
                "batches": data.draw(st.integers(1, 3)),
            }

        def draw_dumps(self, data: Any) -> dict[str, Any]:
            return {"op": "dumps", "same_path": data.draw(st.booleans())}

        def draw_loads(self, data: Any) -> dict[str, Any]:
            mode = data.draw(st.sampled_from(["classmethod", "load", "fresh"]))
            verify = data.draw(st.booleans()) and mode == "classmethod"
            return {"op": "loads", "mode": mode, "verify": verify}

        def draw_state_dict(self, data: Any) -> dict[str, Any]:
            mode = data.draw(st.sampled_from(["inplace", "from_state_dict", "fresh"]))
            loaded = any(op["op"] == "loads" for op in self.ops)
            saves = st.booleans() if save_after_loads or not loaded else st.just(False)
            return {"op": "state_dict", "mode": mode, "torch_save": data.draw(saves)}

        def draw_reopen(self, data: Any) -> dict[str, Any]:
            return {"op": "reopen"}

        def draw_bad(self, data: Any) -> dict[str, Any]:
            kind = data.draw(st.sampled_from(bad_kinds(self.model)))
            op: dict[str, Any] = {"op": "bad", "kind": kind}
            if kind.startswith("extend_"):
                op["form"] = data.draw(st.sampled_from(batch_forms))
            elif kind.startswith("add_"):
                op["form"] = data.draw(st.sampled_from(self.item_forms()))
            return op

        def teardown(self) -> None:
            if len(self.ops) < 2:  # the layout only
                return
            counters.sequences += 1
            counters.steps += len(self.ops)
            counters.spawns += sum(
                1 for op in self.ops if op["op"] == "dataloader" and op["workers"]
            )
            failure = run_sequence(cfg, self.ops)
            if failure is not None:
                counters.failures += 1
                counters.last = (list(self.ops), failure)
                raise AssertionError(failure.text)

    Machine.__name__ = Machine.__qualname__ = "Machine_" + cfg.name.replace("-", "_")
    return Machine


# --- one configuration, and the command line ---------------------------------------------------
def run_config(
    cfg: Config,
    examples: int,
    steps: int,
    spawn: bool,
    seed_value: int | None = None,
    avoid: frozenset[str] = frozenset(),
    minimize_seconds: float = 60.0,
) -> dict[str, Any]:
    """Run hypothesis over ``cfg``; return a JSON-able result (``failure``: None or text)."""
    counters = Counters()
    machine = make_machine(cfg, spawn, counters, avoid)
    test = get_state_machine_test(
        machine,
        settings=settings(
            max_examples=examples,
            stateful_step_count=steps,
            derandomize=seed_value is None,
            deadline=None,
            database=None,
            print_blob=False,
            verbosity=Verbosity.normal,
            phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink],
            suppress_health_check=list(HealthCheck),
        ),
    )
    if seed_value is not None:
        test = seed(seed_value)(test)
    start = time.monotonic()
    out = io.StringIO()
    failure = None
    try:
        with contextlib.redirect_stdout(out):
            test()
    except BaseException as err:  # hypothesis re-raises the shortest failure
        if isinstance(err, KeyboardInterrupt):
            raise
        notes = "\n".join(getattr(err, "__notes__", []))
        failure = f"{type(err).__name__}: {err}\n{notes}"
        caught: BaseException | None = err
    else:
        caught = None
    # (outside the except block: a worker forked there would chain its errors to this one)
    if counters.last is not None and isinstance(caught, AssertionError):
        ops, found = counters.last  # the example hypothesis replayed last: its shortest
        short, found, tried = minimize(cfg, ops, found, minimize_seconds)
        failure = (
            f"{found.text}\n(hypothesis shrank the failing sequence to {len(ops)} steps; "
            f"deleting steps while the failure stays the same ({tried} tries) left "
            f"{len(short)})"
        )
    return {
        "config": cfg.name,
        "failure": failure,
        "hypothesis_output": out.getvalue()[-6000:],
        "sequences": counters.sequences,
        "steps": counters.steps,
        "spawns": counters.spawns,
        "failed_sequences": counters.failures,
        "seconds": round(time.monotonic() - start, 2),
    }


def warm_up() -> None:
    """Load every numba kernel here once, so that forked workers find them compiled."""
    ops: list[dict[str, Any]] = [
        {
            "op": "extend",
            "n": 5,
            "ranks": [0.0, 1.0, 2.0, 3.0, 1.0],
            "dones": [False, True, False, False, True],
            "form": "dict",
            "clobber": False,
        },
        {"op": "add", "rank": 1.0, "done": False, "form": "numpy", "clobber": False},
        {"op": "add", "rank": 2.0, "done": True, "form": "numpy", "clobber": False},
        {"op": "add", "rank": 3.0, "done": False, "form": "numpy", "clobber": False},
        {
            "op": "extend",
            "n": 2,
            "ranks": [3.0, 3.0],
            "dones": [False, True],
            "form": "td",
            "clobber": False,
        },
        {"op": "sample", "bs": 4},
    ]
    for name in (
        "tensor-prioritized-round_robin",
        "memmap-slice-round_robin",
        "arrow-uniform-round_robin",
        "memmap-prioritized-max_value",
    ):
        cfg = Config.parse(name)
        root = Path(tempfile.mkdtemp(prefix="rbdata-model-warm-"))
        try:
            seq = [
                op if not (cfg.strings and op.get("form") == "td") else {**op, "form": "dict"}
                for op in ops
            ]
            for wide in (False, True):
                with contextlib.suppress(Exception):
                    layout = {"op": "layout", "wide": wide}
                    _execute(cfg, [layout, *seq], root / str(wide), lambda k: None)
        finally:
            shutil.rmtree(root, ignore_errors=True)
    gc.collect()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--configs", default="all", help="comma-separated names, or 'all'")
    parser.add_argument("--examples", type=int, default=8)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--spawn", default="", help="configs whose DataLoaders may spawn")
    parser.add_argument("--seed", type=int, default=None, help="random (not derandomized)")
    parser.add_argument("--out", default=None, help="write JSON lines here (default: stdout)")
    parser.add_argument(
        "--avoid", default="", help="reported bugs not to trigger (see make_machine)"
    )
    parser.add_argument("--shrink-seconds", type=float, default=120.0)
    parser.add_argument("--replay", nargs=2, metavar=("CONFIG", "OPS_JSON"))
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # workers are forked: no intra-op thread pool to inherit
    if args.replay:
        cfg, ops = Config.parse(args.replay[0]), json.loads(args.replay[1])
        root = Path(tempfile.mkdtemp(prefix="rbdata-model-replay-"))
        try:
            _execute(cfg, ops, root, lambda k: print(f"step {k}: {describe(ops[k])}", flush=True))
        finally:
            shutil.rmtree(root, ignore_errors=True)
        print("the sequence passed")
        return
    names = [c.name for c in CONFIGS] if args.configs == "all" else args.configs.split(",")
    spawn = set(args.spawn.split(",")) if args.spawn else set()
    # hypothesis stops shrinking after this long (its own default is 300 s)
    try:  # (an internal constant: without it the default applies)
        from hypothesis.internal.conjecture import engine

        engine.MAX_SHRINKING_SECONDS = args.shrink_seconds  # type: ignore[attr-defined]
    except ImportError:  # pragma: no cover
        pass
    avoid = frozenset(a for a in args.avoid.split(",") if a)
    warm_up()
    out = open(args.out, "a") if args.out else sys.stdout  # noqa: SIM115
    try:
        for name in names:
            cfg = Config.parse(name)
            print(f"[model] {name} ...", file=sys.stderr, flush=True)
            result = run_config(
                cfg,
                args.examples,
                args.steps,
                name in spawn or "all" in spawn,
                args.seed,
                avoid,
                args.shrink_seconds,
            )
            print(
                f"[model] {name}: {'FAILED' if result['failure'] else 'ok'}, "
                f"{result['sequences']} sequences / {result['steps']} steps / "
                f"{result['spawns']} spawned DataLoaders, {result['seconds']} s",
                file=sys.stderr,
                flush=True,
            )
            out.write(json.dumps(result) + "\n")
            out.flush()
    finally:
        if out is not sys.stdout:
            out.close()


if __name__ == "__main__":
    main()
