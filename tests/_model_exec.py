"""Run a sequence of operations against a real buffer and check it against ``_model.Model``.

:class:`Runner` owns one buffer (``ReplayBuffer`` over the configuration's storage, sampler and
writer) and its model; :meth:`Runner.step` performs one operation on both and then compares
everything observable: ``len`` of the storage and of the buffer, every stored item (a batch
read and a single-item read), the storage's next slot, the writer's cursor or ranks, the
sampler's priorities, epoch or episode index. An operation the model says must be refused is
checked to raise the named exception and to leave every component's state exactly as it was.

Every stored field of an item encodes its id: ``id``, ``obs = [id, id + .25, id + .5]``,
``rank`` and ``("next", "done")`` as given, and on an ArrowStorage ``note = f"n{id}"``.
"""

from __future__ import annotations

import io
import json
import math
import os
import pickle
import select
import signal
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from itertools import islice
from multiprocessing.reduction import ForkingPickler
from pathlib import Path
from typing import Any

import numpy as np
import torch
from _model import BATCH, BETA, CAP, CHUNK, SLICE_LEN, Config, Item, Model, ModelError
from tensordict import TensorDict
from torch.utils.data import DataLoader

from rbdata import (
    ArrowStorage,
    BatchSampler,
    ListStorage,
    MaxValueWriter,
    MemmapStorage,
    PrioritizedSampler,
    ReplayBuffer,
    RoundRobinWriter,
    SamplerWithoutReplacement,
    SliceSampler,
    TensorStorage,
    UniformSampler,
)
from rbdata.errors import StorageInUseError

__all__ = ["FORK_TIMEOUT", "Data", "Opener", "Runner", "describe"]

FORK_TIMEOUT = 60.0  # a forked reader child, a DataLoader worker batch


# --- data ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Data:
    """The fields of the items of one sequence, every one derived from the item's id.

    Always ``id`` (int64), ``obs = [id, id + .25, id + .5]`` (float32), ``rank`` (float32)
    and ``("next", "done")`` (bool ``[1]``); ``strings``: ``note = f"n{id}"`` (ArrowStorage);
    ``wide``: ``pix``, a uint8 ``[2, 3]`` leaf (no longer a "small" layout: MemmapStorage's
    general journal path instead of the packed one), and on an ArrowStorage the ragged
    ``tokens`` (``id % 3`` values ``id``).
    """

    strings: bool = False
    wide: bool = False

    @property
    def ragged(self) -> bool:
        return self.strings and self.wide

    def fields(self, ids: list[int], ranks: list[float], dones: list[bool]) -> dict[str, Any]:
        idt = torch.tensor(ids, dtype=torch.int64)
        f = idt.to(torch.float32)
        out: dict[str, Any] = {
            "id": idt,
            "obs": torch.stack([f, f + 0.25, f + 0.5], dim=1),
            "rank": torch.tensor(ranks, dtype=torch.float32),
            "next": {"done": torch.tensor(dones, dtype=torch.bool).reshape(-1, 1)},
        }
        if self.wide:
            out["pix"] = (idt % 251).to(torch.uint8).view(-1, 1, 1).expand(-1, 2, 3).clone()
        if self.ragged:
            out["tokens"] = [torch.full((i % 3,), i, dtype=torch.int64) for i in ids]
        if self.strings:
            out["note"] = [f"n{i}" for i in ids]
        return out

    def batch(self, ids: list[int], ranks: list[float], dones: list[bool], form: str) -> Any:
        """A batch of items in one of the accepted forms: ``td``, ``dict`` or ``items``."""
        if form == "items":
            return [self.item(i, r, d, "tensor") for i, r, d in zip(ids, ranks, dones, strict=True)]
        fields = self.fields(ids, ranks, dones)
        if form == "td":
            assert not self.strings, "a TensorDict drops a list of strings"
            return TensorDict(fields, batch_size=[len(ids)])
        return fields

    def item(self, i: int, rank: float, done: bool, form: str) -> Any:
        """One item: ``td`` (TensorDict), ``tensor`` (dict of tensors), ``numpy`` (what an
        environment returns: numpy arrays and scalars, the per-step fast path), ``python``
        (Python numbers where a leaf has no dimension)."""
        obs = np.array([i, i + 0.25, i + 0.5], dtype=np.float32)
        done_a = np.array([done])
        item: dict[str, Any]
        if form == "numpy":
            item = {"id": np.int64(i), "obs": obs, "rank": np.float32(rank)}
        elif form == "python":
            item = {"id": int(i), "obs": obs, "rank": float(rank)}
        else:
            item = {
                "id": torch.tensor(i, dtype=torch.int64),
                "obs": torch.from_numpy(obs),
                "rank": torch.tensor(rank, dtype=torch.float32),
            }
        item["next"] = {"done": done_a if form in ("numpy", "python") else torch.tensor([done])}
        if self.wide:
            pix = np.full((2, 3), i % 251, dtype=np.uint8)
            item["pix"] = pix if form in ("numpy", "python") else torch.from_numpy(pix)
        if self.ragged:
            tokens = np.full(i % 3, i, dtype=np.int64)
            item["tokens"] = tokens if form in ("numpy", "python") else torch.from_numpy(tokens)
        if form == "td":
            assert not self.strings
            return TensorDict(item, batch_size=[])
        if self.strings:
            item["note"] = f"n{i}"
        return item

    # --- reading back ----------------------------------------------------------------------
    def check_rows(self, batch: Any, items: list[Item], what: str) -> None:
        """Every field of ``batch`` is that of ``items`` (in order)."""
        ids = [it.id for it in items]
        exp = self.fields(ids, [it.rank for it in items], [it.done for it in items])
        got_ids = batch["id"].tolist()
        if got_ids != ids:
            raise ModelError(f"{what}: ids {got_ids}, expected {ids}")
        keys: list[Any] = ["obs", "rank", ("next", "done")] + (["pix"] if self.wide else [])
        for key in keys:
            want = exp[key] if isinstance(key, str) else exp["next"]["done"]
            got = batch[key]
            if got.dtype != want.dtype or not torch.equal(got, want):
                raise ModelError(f"{what}: {key} is {got.tolist()}, expected {want.tolist()}")
        if self.ragged:
            tokens = batch["tokens"]
            got_t = [t.tolist() for t in tokens.unbind()] if len(ids) else []
            if got_t != [t.tolist() for t in exp["tokens"]]:
                raise ModelError(f"{what}: tokens are {got_t}, expected {exp['tokens']}")
        if self.strings:
            notes = batch["note"]
            notes = notes.tolist() if hasattr(notes, "tolist") else list(notes)
            if notes != exp["note"]:
                raise ModelError(f"{what}: note is {notes}, expected {exp['note']}")

    def check_item(self, got: Any, item: Item, what: str) -> None:
        exp = self.fields([item.id], [item.rank], [item.done])
        ok = (
            int(got["id"]) == item.id
            and torch.equal(got["obs"], exp["obs"][0])
            and torch.equal(got["rank"], exp["rank"][0])
            and torch.equal(got["next", "done"], exp["next"]["done"][0])
        )
        if self.wide:
            ok = ok and torch.equal(got["pix"], exp["pix"][0])
        if self.ragged:
            ok = ok and torch.equal(got["tokens"], exp["tokens"][0])
        if self.strings:
            ok = ok and got["note"] == f"n{item.id}"
        if not ok:
            shown = dict(got.items()) if hasattr(got, "items") else got
            raise ModelError(f"{what}: item {shown}, expected {item}")


def clobber(data: Any) -> None:
    """Overwrite every array and tensor of ``data`` in place (after a write: no aliasing)."""
    if isinstance(data, TensorDict):
        for key in data.keys(include_nested=True, leaves_only=True):
            clobber(data.get(key))
    elif isinstance(data, dict):
        for v in data.values():
            clobber(v)
    elif isinstance(data, list):
        for v in data:
            clobber(v)
    elif isinstance(data, torch.Tensor):
        if data.dtype == torch.bool:
            data.logical_not_()
        else:
            data.fill_(-7 if data.is_signed() else 7)
    elif isinstance(data, np.ndarray) and data.flags.writeable:
        if data.dtype == np.bool_:
            np.logical_not(data, out=data)
        else:
            data.fill(-7 if data.dtype.kind in "if" else 7)


def _drop(data: Any, key: str) -> Any:
    if isinstance(data, list):
        return [_drop(d, key) for d in data]
    if isinstance(data, TensorDict):
        return data.exclude(key)
    return {k: v for k, v in data.items() if k != key}


def _put(data: Any, key: str, value: Any) -> Any:
    if isinstance(data, TensorDict):
        data = data.clone()
        data.set(key, value)
        return data
    return {**data, key: value}


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (
            isinstance(a, torch.Tensor)
            and isinstance(b, torch.Tensor)
            and a.dtype == b.dtype
            and a.shape == b.shape
            and bool(
                torch.equal(a, b)
                or (
                    a.is_floating_point()
                    and torch.equal(a.isnan(), b.isnan())
                    and torch.equal(a.nan_to_num(), b.nan_to_num())
                )
            )
        )
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return bool(a == b)


def describe(op: dict[str, Any]) -> str:
    """One line for an operation, e.g. ``extend(n=3, ranks=[0, 1, 0], ...)``."""
    args = ", ".join(f"{k}={v!r}" for k, v in op.items() if k != "op")
    return f"{op['op']}({args})"


# --- the runner ----------------------------------------------------------------------------
class Runner:
    """One buffer and its model; :meth:`step` runs an operation on both and compares."""

    def __init__(self, cfg: Config, root: Path, wide: bool = False) -> None:
        self.cfg = cfg
        self.root = root
        self.data = Data(strings=cfg.strings, wide=wide)
        self.model = Model(cfg)
        self.paths = 0
        # forked before any storage exists here: the fork shares nothing
        self.opener = Opener(cfg.storage) if cfg.storage in ("memmap", "arrow") else None
        self.rb = self.new_buffer(self.new_storage())

    # --- construction ------------------------------------------------------------------
    def new_path(self, name: str) -> Path:
        self.paths += 1
        return self.root / f"{name}-{self.paths}"

    def new_storage(self) -> Any:
        kind = self.cfg.storage
        if kind == "list":
            return ListStorage(CAP)
        if kind == "tensor":
            return TensorStorage(CAP)
        if kind == "memmap":
            return MemmapStorage(CAP, path=self.new_path("memmap"))
        ragged = ["tokens"] if self.data.ragged else []
        return ArrowStorage(CAP, path=self.new_path("arrow"), chunk_size=CHUNK, ragged=ragged)

    def new_buffer(self, storage: Any) -> ReplayBuffer:
        gen = torch.Generator().manual_seed(1234)
        kind = self.cfg.sampler
        sampler: Any
        if kind == "uniform":
            sampler = UniformSampler(generator=gen)
        elif kind == "without":
            sampler = SamplerWithoutReplacement(generator=gen)
        elif kind == "prioritized":
            sampler = PrioritizedSampler(CAP, alpha=0.7, beta=BETA, generator=gen)
        else:
            sampler = SliceSampler(slice_len=SLICE_LEN, generator=gen)
        writer = RoundRobinWriter() if self.cfg.writer == "round_robin" else MaxValueWriter("rank")
        return ReplayBuffer(storage, sampler=sampler, writer=writer, batch_size=BATCH)

    def close(self) -> None:
        close = getattr(self.rb.storage, "close", None)
        if close is not None:
            close()
        if self.opener is not None:
            self.opener.stop()

    def _retire(self, rb: ReplayBuffer) -> None:
        """Close the storage of a buffer that another one replaced."""
        if rb.storage is not self.rb.storage:
            close = getattr(rb.storage, "close", None)
            if close is not None:
                close()

    # --- one step -----------------------------------------------------------------------
    def step(self, op: dict[str, Any]) -> None:
        model = self.model
        refused = model.refusal(op)
        do = getattr(self, "do_" + op["op"])
        if refused is not None:
            before = self.state()
            try:
                do(op)
            except Exception as err:
                names = {c.__name__ for c in type(err).__mro__}
                if not names & set(refused):
                    raise ModelError(
                        f"expected {' or '.join(refused)}, got {type(err).__name__}: {err}"
                    ) from err
            else:
                raise ModelError(f"expected {' or '.join(refused)}; the call succeeded")
            after = self.state()
            for key in before:
                if not _same(before[key], after[key]):
                    raise ModelError(
                        f"a refused call changed {key}: {before[key]!r} -> {after[key]!r}"
                    )
        else:
            result, returned = do(op)
            expected = model.apply(op, result)
            if op["op"] in ("extend", "add", "move_while_writing", "open_elsewhere"):
                if isinstance(returned, torch.Tensor):
                    returned = returned.tolist()
                if returned != expected:
                    raise ModelError(f"returned slots {returned}, expected {expected}")
        self.check()

    def state(self) -> dict[str, Any]:
        """Everything a refused call must leave as it was."""
        rb, st = self.rb, self.rb.storage
        n = len(st)
        return {
            "len": n,
            "next_slot": st.next_slot,
            "layout": st.layout,
            "rows": None if not n else _rows(st[torch.arange(n)]),
            "writer": rb.writer.state_dict(),
            "sampler": rb.sampler.state_dict(),
        }

    # --- the comparison after every step ------------------------------------------------
    def check(self) -> None:
        m, rb, cfg = self.model, self.rb, self.cfg
        st = rb.storage
        n = len(m)
        _eq("len(storage)", len(st), n)
        _eq("len(buffer)", len(rb), n)
        _eq("storage.next_slot", st.next_slot, m.next_slot)
        _eq("layout fixed", st.layout is not None, m.layout)
        if n:
            self.data.check_rows(st[torch.arange(n)], m.items, "storage[0:len]")
            self.data.check_item(st[n - 1], m.items[n - 1], f"storage[{n - 1}]")
        if cfg.writer == "round_robin":
            _eq("writer.cursor", rb.writer.cursor, m.cursor)
        else:
            sd = rb.writer.state_dict()
            if m.mv is None:
                _eq("writer ranks", sd["ranks"], None)
            else:
                _eq("writer ranks", sd["ranks"].tolist(), m.mv["ranks"])
                _eq("writer stamps", sd["stamps"].tolist(), m.mv["stamps"])
                _eq("writer count", sd["count"], m.mv["count"])
                _eq("writer next_stamp", sd["next_stamp"], m.mv["next_stamp"])
        sampler = rb.sampler
        if cfg.sampler == "prioritized":
            got = sampler.priority_values()[:n].double()
            want = torch.tensor(m.values(), dtype=torch.float32).double()
            if not torch.allclose(got, want, rtol=1e-6, atol=0):
                raise ModelError(f"priority values {got.tolist()}, expected {want.tolist()}")
            _eq("max_priority", sampler.max_priority, m.max_p)
        elif cfg.sampler == "without":
            sd = sampler.state_dict()
            _eq("epoch position", sd["pos"], m.pos)
            perm = sd["perm"]
            _eq("epoch size", None if perm is None else perm.numel(), m.epoch_n)
            if perm is not None:
                _eq("epoch drawn", perm[: m.pos].tolist(), m.drawn)
        elif cfg.sampler == "slice":
            sd = sampler.state_dict()
            _eq("slice index time", sd["time"], m.time)
            _eq("slice index base", sd["base"], m.base)
            _eq("slice index ends", sd["ends"].tolist(), m.ends)

    def check_batch(self, batch: Any, batch_size: int, what: str) -> list[int]:
        """A drawn batch: in range, the model's items, and what the sampler promises."""
        m, cfg = self.model, self.cfg
        idx = batch["index"].tolist()
        n = len(m)
        if any(not 0 <= i < n for i in idx):
            raise ModelError(f"{what}: index {idx} outside [0, {n})")
        self.data.check_rows(batch, [m.items[i] for i in idx], what)
        if cfg.sampler != "without":
            _eq(f"{what}: batch size", len(idx), batch_size)
        if cfg.sampler == "prioritized":
            values = np.array(m.values(), dtype=np.float32).astype(np.float64)
            positive = [float(np.float32(v)) for v in m.values() if v > 0]
            if any(values[i] <= 0 for i in idx):
                raise ModelError(f"{what}: drew {idx}, some of priority value 0")
            vmin = min(positive)
            want = torch.tensor([(values[i] / vmin) ** -BETA for i in idx], dtype=torch.float64)
            got = batch["weight"].double()
            if not torch.allclose(got, want, rtol=1e-5, atol=0):
                raise ModelError(f"{what}: weights {got.tolist()}, expected {want.tolist()}")
        if cfg.sampler == "slice":
            self._check_slices(idx, batch, what)
        return idx

    def _check_slices(self, idx: list[int], batch: Any, what: str) -> None:
        m = self.model
        starts = set(m.valid_starts())
        assert m.base is not None
        times = range(max(0, m.time - CAP), m.time)
        for k in range(0, len(idx), SLICE_LEN):
            run = idx[k : k + SLICE_LEN]
            if run != [(run[0] + j) % CAP for j in range(SLICE_LEN)]:
                raise ModelError(f"{what}: slice {run} is not consecutive ring slots")
            t = [t for t in times if (m.base + t) % CAP == run[0]]
            if not t or t[0] not in starts:
                raise ModelError(
                    f"{what}: slice {run} (time {t}) does not start a valid slice; valid start "
                    f"times {sorted(starts)}, base {m.base}, time {m.time}, ends {m.ends}"
                )
        want = torch.arange(len(idx) // SLICE_LEN).repeat_interleave(SLICE_LEN)
        _eq(f"{what}: slice ids", batch["slice"].tolist(), want.tolist())

    # --- operations: each returns (result for the model, value returned) -----------------
    def do_layout(self, op: dict[str, Any]) -> tuple[Any, Any]:
        """The data's fields (first operation only; read by the constructor)."""
        return None, None

    def do_extend(self, op: dict[str, Any]) -> tuple[Any, Any]:
        n = op["n"]
        ids = list(range(self.model.next_id, self.model.next_id + n))
        data = self.data.batch(ids, op["ranks"], op["dones"], op["form"])
        slots = self.rb.extend(data)
        if op["clobber"]:
            clobber(data)
        return None, slots

    def do_add(self, op: dict[str, Any]) -> tuple[Any, Any]:
        i = self.model.next_id
        item = self.data.item(i, op["rank"], op["done"], op["form"])
        slot = self.rb.add(item)
        if op["clobber"]:
            clobber(item)
        return None, slot

    def do_set(self, op: dict[str, Any]) -> tuple[Any, Any]:
        n, slots = len(self.model), op["slots"]
        ids = list(range(self.model.next_id, self.model.next_id + len(slots)))
        form, st = op["form"], self.rb.storage
        if form in ("int", "neg_int"):
            item = self.data.item(ids[0], op["ranks"][0], op["dones"][0], op["dform"])
            st.set(slots[0] - (n if form == "neg_int" else 0), item)
            if op["clobber"]:
                clobber(item)
            return None, None
        data = self.data.batch(ids, op["ranks"], op["dones"], op["dform"])
        index: Any
        if form == "slice":
            index = slice(slots[0], slots[-1] + 1)
        elif form == "neg_slice":
            stop = slots[-1] + 1
            index = slice(slots[0] - n, None if stop == n else stop - n)
        elif form == "list":
            index = list(slots)
        else:
            index = torch.tensor(slots)
        st.set(index, data)
        if op["clobber"]:
            clobber(data)
        return None, None

    def do_sample(self, op: dict[str, Any]) -> tuple[Any, Any]:
        batch = self.rb.sample(op["bs"])
        return [self.check_batch(batch, op["bs"], "sample")], None

    def do_update_priority(self, op: dict[str, Any]) -> tuple[Any, Any]:
        index, prio = op["index"], op["prio"]
        iform, pform = op["iform"], op["pform"]
        idx: Any = {"list": list(index), "numpy": np.array(index), "tensor": torch.tensor(index)}[
            iform
        ]
        p: Any
        if not isinstance(prio, list):
            p = prio
        elif pform == "list":
            p = list(prio)
        elif pform == "numpy":
            p = np.array(prio)
        else:
            p = torch.tensor(prio, dtype=torch.float32 if pform == "tensor32" else torch.float64)
        self.rb.update_priority(idx, p)
        return None, None

    def do_iterate(self, op: dict[str, Any]) -> tuple[Any, Any]:
        batches = op.get("batches")
        it = iter(self.rb)
        out = []
        for batch in it if batches is None else islice(it, batches):
            out.append(self.check_batch(batch, BATCH, f"iteration batch {len(out)}"))
        return out, None

    def do_dataloader(self, op: dict[str, Any]) -> tuple[Any, Any]:
        rb, workers = self.rb, op["workers"]
        epoch = self.cfg.sampler == "without"
        batches = BatchSampler(rb.sampler, op["bs"], num_batches=None if epoch else op["batches"])
        loader = DataLoader(
            rb.storage,
            batch_sampler=batches,
            num_workers=workers,
            multiprocessing_context="spawn" if workers else None,
            timeout=FORK_TIMEOUT if workers else 0,
        )
        out = []
        for batch in loader:
            out.append(self.check_batch(batch, op["bs"], f"DataLoader batch {len(out)}"))
        return out, None

    def do_pickle(self, op: dict[str, Any]) -> tuple[Any, Any]:
        obj = self.rb.storage if op["target"] == "storage" else self.rb
        buf = io.BytesIO()
        ForkingPickler(buf, pickle.HIGHEST_PROTOCOL).dump(obj)
        if op["load"]:
            copy = pickle.loads(buf.getvalue())
            st = copy if op["target"] == "storage" else copy.storage
            n = len(self.model)
            _eq("len(unpickled storage)", len(st), n)
            if n:
                self.data.check_rows(st[torch.arange(n)], self.model.items, "unpickled")
            del copy, st
        return None, None

    def do_share(self, op: dict[str, Any]) -> tuple[Any, Any]:
        st = self.rb.storage
        if isinstance(st, MemmapStorage):
            st.share()
        else:
            for b in st.buffers:
                b.share_memory_()
        return None, None

    def do_move_while_writing(self, op: dict[str, Any]) -> tuple[Any, Any]:
        """A thread adds items while this one pickles the storage for another process."""
        first = self.model.next_id
        items = [
            self.data.item(first + j, rank, done, "tensor")
            for j, (rank, done) in enumerate(zip(op["ranks"], op["dones"], strict=True))
        ]
        storage = self.rb.storage
        ForkingPickler.dumps(storage)  # once before: a MemmapStorage is shared from here
        slots: list[int] = []
        errors: list[BaseException] = []

        def write() -> None:
            try:
                slots.extend(self.rb.add(item) for item in items)
            except BaseException as err:
                errors.append(err)

        thread = threading.Thread(target=write)
        thread.start()
        while thread.is_alive():
            ForkingPickler.dumps(storage)  # moves a TensorStorage's memory (the first time)
        thread.join()
        if errors:
            raise errors[0]
        return None, slots

    def do_open_elsewhere(self, op: dict[str, Any]) -> tuple[Any, Any]:
        """Another process opens the path, extends with a RoundRobinWriter, closes."""
        first = self.model.next_id
        ids = list(range(first, first + len(op["ranks"])))
        reply = self.opener.run(self.rb.storage.path, self.data, ids, op["ranks"], op["dones"])
        if reply.get("error"):
            raise ModelError(f"the other process failed:\n{reply['error']}")
        len(self.rb)  # the buffer looks at the shared count: its sampler hears of the items
        return None, reply.get("slots")

    def do_fork_read(self, op: dict[str, Any]) -> tuple[Any, Any]:
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: read everything, draw a batch, report; never return
            os.close(read)
            code, message = 1, "ok"
            try:
                self.check()
                if self.model.sampleable():
                    bs = BATCH if self.cfg.sampler == "slice" else 3
                    self.check_batch(self.rb.sample(bs), bs, "sample in the child")
                code = 0
            except BaseException as err:
                message = "".join(traceback.format_exception(err))[-8000:]
            finally:
                os.write(write, message.encode())
                os._exit(code)
        os.close(write)
        message, status = _wait_child(pid, read, FORK_TIMEOUT)
        if status != 0:
            raise ModelError(f"the forked reader failed ({_status(status)}):\n{message}")
        return None, None

    def do_dumps(self, op: dict[str, Any]) -> tuple[Any, Any]:
        path = self.root / "ckpt" if op["same_path"] else self.new_path("ckpt")
        self.rb.dumps(path, fsync=False)
        self.ckpt_path = path
        return None, None

    def do_loads(self, op: dict[str, Any]) -> tuple[Any, Any]:
        old, mode = self.rb, op["mode"]
        if mode == "classmethod":
            self.rb = ReplayBuffer.loads(self.ckpt_path, verify=op["verify"])
        elif mode == "load":
            self.rb.load(self.ckpt_path)
        else:
            self.rb = self.new_buffer(self.new_storage())
            self.rb.load(self.ckpt_path)
        self._retire(old)
        return None, None

    def do_state_dict(self, op: dict[str, Any]) -> tuple[Any, Any]:
        old, mode = self.rb, op["mode"]
        state = self.rb.state_dict()
        if op["torch_save"]:
            buf = io.BytesIO()
            torch.save(state, buf)
            buf.seek(0)
            state = torch.load(buf, weights_only=True)
        if mode == "inplace":
            self.rb.load_state_dict(state)
        elif mode == "from_state_dict":
            self.rb = ReplayBuffer.from_state_dict(state)
        else:
            self.rb = self.new_buffer(self.new_storage())
            self.rb.load_state_dict(state)
        self._retire(old)
        return None, None

    def do_reopen(self, op: dict[str, Any]) -> tuple[Any, Any]:
        st = self.rb.storage
        path = st.path
        st.close()
        self.rb = self.new_buffer(type(st).open(path))
        return None, None

    def do_bad(self, op: dict[str, Any]) -> tuple[Any, Any]:
        BAD_CALLS[op["kind"]](self, op)
        return None, None


class Opener:
    """Another process that opens a storage's path and extends it (``open_elsewhere``).

    Forked when the runner starts, before it makes any storage (so the fork shares none); it
    waits for requests on a pipe and answers each with the slots it wrote, ``None`` when the
    open was refused (``StorageInUseError``), or the error.
    """

    def __init__(self, kind: str) -> None:
        self.kind = kind
        req_r, self._req = os.pipe()
        self._rep, rep_w = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:  # the other process: serve, never return
            os.close(self._req)
            os.close(self._rep)
            code, parent = 0, os.getppid()
            try:
                with os.fdopen(req_r, "r") as requests, os.fdopen(rep_w, "w") as replies:
                    while os.getppid() == parent:  # an orphan stops
                        if not select.select([requests], [], [], 1.0)[0]:
                            continue
                        line = requests.readline()
                        if not line:
                            break
                        replies.write(json.dumps(self._serve(json.loads(line))) + "\n")
                        replies.flush()
            except BaseException:
                code = 1
            finally:
                os._exit(code)
        os.close(req_r)
        os.close(rep_w)
        self._replies = os.fdopen(self._rep, "r")

    def _serve(self, req: dict[str, Any]) -> dict[str, Any]:
        try:
            cls = MemmapStorage if self.kind == "memmap" else ArrowStorage
            try:
                storage = cls.open(req["path"])
            except StorageInUseError:
                return {"slots": None}
            try:
                data = Data(strings=req["strings"], wide=req["wide"])
                batch = data.batch(req["ids"], req["ranks"], req["dones"], "dict")
                slots = ReplayBuffer(storage).extend(batch).tolist()
            finally:
                storage.close()
            return {"slots": slots}
        except BaseException as err:
            return {"error": "".join(traceback.format_exception(err))[-8000:]}

    def run(
        self, path: Path, data: Data, ids: list[int], ranks: list[float], dones: list[bool]
    ) -> dict[str, Any]:
        req = {"path": str(path), "strings": data.strings, "wide": data.wide}
        req.update(ids=ids, ranks=ranks, dones=dones)
        os.write(self._req, (json.dumps(req) + "\n").encode())
        line = self._replies.readline()
        if not line:
            raise ModelError("the other process died")
        reply: dict[str, Any] = json.loads(line)
        return reply

    def stop(self) -> None:
        os.close(self._req)
        self._replies.close()
        os.kill(self.pid, signal.SIGKILL)  # forked readers may hold the pipe open: no wait
        os.waitpid(self.pid, 0)


def _rows(batch: Any) -> dict[str, Any]:
    out = {}
    for key in batch.keys(include_nested=True, leaves_only=True):
        v = batch.get(key)
        if isinstance(v, torch.Tensor) and v.is_nested:
            out[str(key)] = [t.tolist() for t in v.unbind()]
        else:
            out[str(key)] = v.tolist() if hasattr(v, "tolist") else v
    return out


def _eq(what: str, got: Any, want: Any) -> None:
    if not _same(got, want):
        raise ModelError(f"{what} is {got!r}, expected {want!r}")


def _status(status: int) -> str:
    if os.WIFSIGNALED(status):
        return f"killed by signal {os.WTERMSIG(status)}"
    return f"exit code {os.WEXITSTATUS(status)}"


def _wait_child(pid: int, fd: int, timeout: float) -> tuple[str, int]:
    """Read a child's report from ``fd`` until EOF; reap it (killed after ``timeout``)."""
    chunks, deadline = [], time.monotonic() + timeout
    try:
        while True:
            left = deadline - time.monotonic()
            ready, _, _ = select.select([fd], [], [], max(0.0, left))
            if not ready:
                os.kill(pid, 9)
                chunks.append(b"\n[timed out: killed]")
                break
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(fd)
    _, status = os.waitpid(pid, 0)
    return b"".join(chunks).decode(errors="replace"), status


# --- bad inputs ------------------------------------------------------------------------------
def _bad_batch(r: Runner, op: dict[str, Any], n: int = 2) -> Any:
    ids = list(range(10_000, 10_000 + n))
    return r.data.batch(ids, [1.0] * n, [False] * n, op.get("form", "dict"))


def _bad_item(r: Runner, op: dict[str, Any]) -> Any:
    return r.data.item(10_000, 1.0, False, op.get("form", "numpy"))


def _extend_with(change: Callable[[Any, int], Any]) -> Callable[[Runner, dict[str, Any]], None]:
    def call(r: Runner, op: dict[str, Any]) -> None:
        r.rb.extend(change(_bad_batch(r, op), 2))

    return call


def _add_with(change: Callable[[Any], Any]) -> Callable[[Runner, dict[str, Any]], None]:
    def call(r: Runner, op: dict[str, Any]) -> None:
        r.rb.add(change(_bad_item(r, op)))

    return call


def _each(data: Any, change: Callable[[Any], Any]) -> Any:
    return [change(d) for d in data] if isinstance(data, list) else change(data)


def _item_dtype(item: Any) -> Any:
    value = item["id"]
    if isinstance(value, torch.Tensor):
        return _put(item, "id", torch.tensor(0.5))
    return _put(item, "id", np.float32(0.5) if isinstance(value, np.generic) else 0.5)


def _item_nan(item: Any) -> Any:
    value = item["rank"]
    nan = float("nan")
    if isinstance(value, torch.Tensor):
        return _put(item, "rank", torch.tensor(nan))
    return _put(item, "rank", np.float32(nan) if isinstance(value, np.generic) else nan)


def _batch_put(key: str, make: Callable[[int], Any]) -> Callable[[Any, int], Any]:
    def change(data: Any, n: int) -> Any:
        if isinstance(data, list):
            items = [make_batch_item_change(d, key, make) for d in data]
            return items
        return _put(data, key, make(n))

    return change


def make_batch_item_change(item: Any, key: str, make: Callable[[int], Any]) -> Any:
    value = make(1)
    return _put(item, key, value[0] if isinstance(value, torch.Tensor) else value)


def _extend_too_many(r: Runner, op: dict[str, Any]) -> None:
    r.rb.extend(_bad_batch(r, op, CAP + 1))


def _set_item(r: Runner, index: int, change: Callable[[Any], Any] = lambda x: x) -> None:
    r.rb.storage.set(index, change(_bad_item(r, {"form": "tensor"})))


def _priority(index: Any, prio: Any) -> Callable[[Runner, dict[str, Any]], None]:
    def call(r: Runner, op: dict[str, Any]) -> None:
        n = len(r.model)
        i = [n] if index == "len" else index
        r.rb.update_priority(torch.tensor(i), torch.tensor(prio, dtype=torch.float64))

    return call


BAD_CALLS: dict[str, Callable[[Runner, dict[str, Any]], None]] = {
    "extend_missing_key": lambda r, op: r.rb.extend(_drop(_bad_batch(r, op), "obs")),
    "extend_extra_key": _extend_with(_batch_put("extra", lambda n: torch.zeros(n))),
    "extend_shape": _extend_with(_batch_put("obs", lambda n: torch.zeros(n, 4))),
    "extend_dtype": _extend_with(_batch_put("id", lambda n: torch.full((n,), 0.5))),
    "extend_batch_mismatch": lambda r, op: r.rb.extend(
        _put(_bad_batch(r, {**op, "form": "dict"}), "obs", torch.zeros(3, 3))
    ),
    "extend_too_many": _extend_too_many,
    "extend_nan_rank": _extend_with(
        _batch_put("rank", lambda n: torch.tensor([float("nan")] + [1.0] * (n - 1)))
    ),
    "add_missing_key": _add_with(lambda item: _drop(item, "obs")),
    "add_extra_key": _add_with(lambda item: _put(item, "extra", np.float32(0))),
    "add_shape": _add_with(lambda item: _put(item, "obs", np.zeros(4, np.float32))),
    "add_dtype": _add_with(_item_dtype),
    "add_nan_rank": _add_with(_item_nan),
    "set_out_of_range": lambda r, op: _set_item(r, CAP),
    "set_negative_out_of_range": lambda r, op: _set_item(r, -len(r.model) - 1),
    "set_count_mismatch": lambda r, op: r.rb.storage.set(slice(0, 1), _bad_batch(r, op)),
    "set_missing_key": lambda r, op: _set_item(r, 0, lambda item: _drop(item, "obs")),
    "priority_negative": _priority([0], [-1.0]),
    "priority_nan": _priority([0], [float("nan")]),
    "priority_inf": _priority([0], [float("inf")]),
    "priority_overflow": _priority([0], [1e60]),
    "priority_index_high": _priority("len", [1.0]),
    "priority_index_negative": _priority([-1], [1.0]),
    "priority_length_mismatch": _priority([0, 0], [1.0]),
    "priority_no_sampler": lambda r, op: r.rb.update_priority([0], [1.0]),
    "sample_zero": lambda r, op: r.rb.sample(0),
    "sample_negative": lambda r, op: r.rb.sample(-1),
    "sample_not_multiple": lambda r, op: r.rb.sample(SLICE_LEN + 1),
}
