"""The plain-Python reference model of a replay buffer, for ``tests/test_model_based.py``.

A buffer is a storage x sampler x writer (:class:`Config`) of capacity :data:`CAP`. The model
keeps what the buffer should hold after any sequence of operations, in plain Python: the items
of slots ``[0, len)`` (each an :class:`Item` whose every stored field encodes its id), the
storage's next slot, the writer's cursor (round robin) or its ranks and arrival stamps (max
value: the top-k by the key), the sampler's priorities (a dict), its epoch (without
replacement) or its episode index (slices), and the storage's sharing state. Nothing here
imports rbdata: the model is the specification, written from the docs.

An operation is a JSON-able dict ``{"op": name, ...}``; :meth:`Model.refusal` says whether the
library must refuse it (and with which exceptions), :meth:`Model.apply` moves the model. The
model is used twice: while hypothesis generates a sequence (``result=None``: the outcome of
random draws is unknown, only what the preconditions need is kept) and while a worker runs
the sequence against the library (the draws' results are given and checked).
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Any, NamedTuple

__all__ = [
    "ALPHA",
    "BATCH",
    "BETA",
    "CAP",
    "CHUNK",
    "CONFIGS",
    "EPS",
    "INVALID",
    "PRIORITIES",
    "SAMPLERS",
    "SLICE_LEN",
    "STORAGES",
    "WRITERS",
    "Config",
    "Item",
    "Model",
    "ModelError",
    "bad_kinds",
]

CAP = 7  # storage capacity: small, odd (sum tree), so that rings wrap within a few steps
CHUNK = 3  # ArrowStorage chunk size: chunks of 3, 3 and 1 rows
SLICE_LEN = 2
BATCH = 4  # the buffer's batch_size (a multiple of SLICE_LEN)
ALPHA, BETA, EPS = 0.7, 0.5, 1e-8
#: priorities the machine draws: exact in float32, so the model's max is the sampler's
PRIORITIES = (0.0, 0.25, 0.5, 1.0, 2.0, 3.5, 8.0)

STORAGES = ("list", "tensor", "memmap", "arrow")
SAMPLERS = ("uniform", "without", "prioritized", "slice")
WRITERS = ("round_robin", "max_value")

#: Where ``MaxValueWriter.extend`` puts the kept rows of a batch. Its docstring says "the same
#: result as adding the items one by one" ("item_by_item"), but it pairs the freed slots and
#: the incoming rows in ascending order ("vectorised"): the same items are kept, some in other
#: slots (reported with issue 22; see the report of the model-based test).
MV_PLACEMENT = "vectorised"

#: combinations the library refuses by design, with the reason (tested on their own)
INVALID: dict[tuple[str, str], str] = {
    ("slice", "max_value"): (
        "SliceSampler indexes episodes in ring (time) order and refuses writes that do not "
        "continue it; MaxValueWriter replaces the lowest-ranked slot, anywhere"
    ),
}


class ModelError(AssertionError):
    """The library disagrees with the model."""


@dataclass(frozen=True)
class Config:
    """One buffer assembly: storage x sampler x writer."""

    storage: str
    sampler: str
    writer: str

    @property
    def name(self) -> str:
        return f"{self.storage}-{self.sampler}-{self.writer}"

    @property
    def on_disk(self) -> bool:
        return self.storage in ("memmap", "arrow")

    @property
    def strings(self) -> bool:
        """Whether items carry a ``str`` field (ArrowStorage keeps variable-length fields)."""
        return self.storage == "arrow"

    @classmethod
    def parse(cls, name: str) -> Config:
        storage, sampler, writer = name.split("-")
        return cls(storage, sampler, writer)


CONFIGS = [
    Config(s, p, w) for s in STORAGES for p in SAMPLERS for w in WRITERS if (p, w) not in INVALID
]


class Item(NamedTuple):
    """What a slot holds: every stored field is derived from these (``_model_exec.Data``)."""

    id: int
    rank: float
    done: bool


def value(p: float) -> float:
    """The sum tree's value of priority ``p``."""
    return (p + EPS) ** ALPHA


class Model:
    """The reference model of one buffer (see the module doc)."""

    def __init__(self, cfg: Config, track: bool = True) -> None:
        self.cfg = cfg
        self.track = track  # False while generating: results of draws are unknown
        self.items: list[Item] = []
        self.next_slot = 0
        self.layout = False  # fixed by the first write
        self.next_id = 0
        self.cursor: int | None = None  # RoundRobinWriter
        self.pending = False  # its cursor was loaded: the next write goes there
        self.mv: dict[str, Any] | None = None  # MaxValueWriter: ranks, stamps, count, next_stamp
        self.prio: dict[int, float] = {}  # PrioritizedSampler; a slot without one: value 0
        self.max_p = 1.0
        self.epoch_n: int | None = None  # SamplerWithoutReplacement: size of the epoch
        self.pos = 0
        self.drawn: list[int] = []
        self.time = 0  # SliceSampler: absolute time of the next step, slot of time 0, ends
        self.base: int | None = None
        self.ends: list[int] = []
        self.shared = False  # a MemmapStorage written under the shared lock
        self.cow = False  # a copy-on-write MemmapStorage (ReplayBuffer.loads)
        self.reopenable = cfg.on_disk  # the storage is the one at the buffer's own path
        self.ckpt: Model | None = None

    # --- queries ------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.items)

    def snapshot(self) -> Model:
        """A copy without the checkpoint (what a checkpoint or a child process holds)."""
        ckpt, self.ckpt = self.ckpt, None
        try:
            return copy.deepcopy(self)
        finally:
            self.ckpt = ckpt

    def values(self) -> list[float]:
        """The sum tree's value of every slot in ``[0, len)``."""
        return [value(self.prio[i]) if i in self.prio else 0.0 for i in range(len(self))]

    def valid_starts(self) -> list[int]:
        """SliceSampler: absolute times where a slice of SLICE_LEN steps of one episode starts."""
        oldest = max(0, self.time - CAP)
        ends = set(self.ends)
        return [
            s
            for s in range(oldest, self.time - SLICE_LEN + 1)
            if not any(e in ends for e in range(s, s + SLICE_LEN - 1))
        ]

    def sampleable(self) -> bool:
        """Whether ``sample`` must succeed (for any valid batch size)."""
        if not self.items:
            return False
        if self.cfg.sampler == "slice":
            return bool(self.valid_starts())
        if self.cfg.sampler == "prioritized":
            return any(v > 0 for v in self.values())
        return True

    def rr_start(self) -> int:
        """Where a RoundRobinWriter writes next."""
        if self.shared:  # slots come from the storage's shared next slot, under the lock
            return self.next_slot
        if self.pending and self.cursor is not None:  # a loaded cursor: the next write
            return self.cursor
        return self.next_slot  # the ring's one cursor, kept by the storage

    # --- refusals -----------------------------------------------------------------------
    def refusal(self, op: dict[str, Any]) -> tuple[str, ...] | None:
        """The exception names the library must raise for ``op`` (``None``: it must succeed).

        A refused operation changes nothing: neither the data nor any component's state.
        """
        kind, cfg = op["op"], self.cfg
        if kind == "bad":
            return BAD[op["kind"]]
        if kind in ("sample", "iterate", "dataloader"):
            if not self.items:
                return ("EmptyBufferError",)
            if not self.sampleable():
                return ("ValueError",)
        if cfg.sampler == "slice" and kind in ("extend", "add") and cfg.writer == "round_robin":
            n = 1 if kind == "add" else op["n"]
            first = self.rr_start()
            if n and self.base is not None and (self.base + self.time) % CAP != first:
                return ("ValueError",)  # the write does not continue the time order
        return None

    # --- transitions --------------------------------------------------------------------
    def new_items(self, ranks: list[float], dones: list[bool]) -> list[Item]:
        items = [
            Item(self.next_id + j, r, d) for j, (r, d) in enumerate(zip(ranks, dones, strict=True))
        ]
        self.next_id += len(items)
        return items

    def _commit(self, slots: list[int], items: list[Item], placed: bool = False) -> None:
        """A storage commit: rows at ``slots`` (in order); the length grows to the top slot.

        A writer's commit moves the storage's next slot to after its last slot; a ``set``
        (``placed``) only when its slots are ``next_slot, next_slot + 1, ...`` (wrapping).
        """
        top = max(slots, default=-1) + 1
        grown: list[Any] = self.items + [None] * max(0, top - len(self.items))
        for slot, item in zip(slots, items, strict=True):
            grown[slot] = item
        assert None not in grown, "the machine never leaves holes"
        self.items = grown
        if slots:
            ring = [(self.next_slot + j) % CAP for j in range(len(slots))]
            if not placed or slots == ring:
                self.next_slot = (slots[-1] + 1) % CAP
            self.layout = True

    def apply(self, op: dict[str, Any], result: Any = None) -> Any:
        """Move the model by ``op`` (which must not be refused); return what it must return.

        ``result`` is what the library returned, for the operations whose outcome is random
        (the indices a sampler drew); the model checks it (``ModelError``) and keeps it.
        """
        if self.refusal(op) is not None:
            return None
        method = getattr(self, "_op_" + op["op"], None)
        if method is None:
            return None
        return method(op, result)

    def _op_extend(self, op: dict[str, Any], result: Any) -> list[int]:
        items = self.new_items(op["ranks"], op["dones"])
        return self.write(items)

    def _op_add(self, op: dict[str, Any], result: Any) -> int:
        items = self.new_items([op["rank"]], [op["done"]])
        slots = self.write(items, single=True)
        return slots[0] if slots else -1

    def write(self, items: list[Item], single: bool = False) -> list[int]:
        """A write through the buffer: the writer picks slots, the sampler hears of them."""
        if self.cfg.writer == "round_robin":
            start = self.rr_start()
            slots = [(start + j) % CAP for j in range(len(items))]
            self._commit(slots, items)
            self.cursor = (start + len(items)) % CAP
            self.pending = False
            kept = items
        else:
            slots, kept = self._top_k(items)
            self._commit(slots, kept)
        self._on_write(slots, kept)
        return slots

    def _mv_state(self) -> dict[str, Any]:
        if self.mv is None:  # the first write reads the ranks of the items already stored
            count = min(len(self.items), CAP)
            ranks = [self.items[i].rank for i in range(count)] + [-math.inf] * (CAP - count)
            stamps = list(range(count)) + [0] * (CAP - count)
            self.mv = {"ranks": ranks, "stamps": stamps, "count": count, "next_stamp": count}
        return self.mv

    def _top_k(self, items: list[Item]) -> tuple[list[int], list[Item]]:
        """MaxValueWriter, item by item: fill empty slots, else replace the minimum if higher.

        Among equal ranks the newest counts as the minimum (ties keep the older item); a batch
        item replaced by a later one of the same batch is not written.
        """
        mv = self._mv_state()
        ranks, stamps = mv["ranks"], mv["stamps"]
        filled = mv["count"]
        slot_of: dict[int, int] = {}  # batch row -> slot
        for row, item in enumerate(items):
            stamp = mv["next_stamp"] + row
            if filled < CAP:
                slot = filled
                filled += 1
            else:
                low = min(range(CAP), key=lambda s: (ranks[s], -stamps[s]))
                if not item.rank > ranks[low]:
                    continue
                slot = low
            for other in [r for r, s in slot_of.items() if s == slot]:
                del slot_of[other]
            ranks[slot], stamps[slot] = float(item.rank), stamp
            slot_of[row] = slot
        if len(items) > 1 and MV_PLACEMENT == "vectorised":
            # what MaxValueWriter.extend does: the same items kept, but the rows that did not
            # stay in their fill slot go to the freed slots in ascending order of both
            count = mv["count"]
            stay = {r: s for r, s in slot_of.items() if s == count + r}
            moved = sorted(r for r in slot_of if r not in stay)
            free = sorted(s for r, s in slot_of.items() if r not in stay)
            slot_of = {**stay, **dict(zip(moved, free, strict=True))}
            for r, s in slot_of.items():
                ranks[s], stamps[s] = float(items[r].rank), mv["next_stamp"] + r
        mv["count"] = min(CAP, mv["count"] + len(items))
        mv["next_stamp"] += len(items)
        rows = sorted(slot_of)
        return [slot_of[r] for r in rows], [items[r] for r in rows]

    def _on_write(self, slots: list[int], items: list[Item]) -> None:
        sampler = self.cfg.sampler
        if sampler == "prioritized":
            for slot in slots:
                self.prio[slot] = self.max_p
        elif sampler == "slice" and slots:
            self._index_steps(slots, [item.done for item in items])

    def _index_steps(self, slots: list[int], dones: list[bool]) -> None:
        if self.base is None:
            self.base = slots[0]
        start = self.time
        self.ends += [start + j for j, done in enumerate(dones) if done]
        self.time = start + len(slots)
        oldest = max(0, self.time - CAP)
        self.ends = [e for e in self.ends if e >= oldest]

    def _op_set(self, op: dict[str, Any], result: Any) -> None:
        """``storage.set``: the data only (the writer and the sampler are not told)."""
        items = self.new_items(op["ranks"], op["dones"])
        self._commit(list(op["slots"]), items, placed=True)

    def _op_update_priority(self, op: dict[str, Any], result: Any) -> None:
        index = op["index"]
        prio = op["prio"] if isinstance(op["prio"], list) else [op["prio"]] * len(index)
        for i, p in zip(index, prio, strict=True):
            self.prio[i] = p
        self.max_p = max([self.max_p, *prio])

    # --- draws: results are lists of index lists, None while generating -----------------
    def batches_of(self, op: dict[str, Any], batch_size: int) -> int:
        """How many batches an iteration or a DataLoader epoch of ``op`` yields."""
        if self.cfg.sampler == "without":  # one fresh epoch (a DataLoader's is whole)
            epoch = self.epoch_batches(batch_size)
            limit = op.get("batches") if op["op"] == "iterate" else None
            return epoch if limit is None else min(limit, epoch)
        return int(op["batches"])

    def _draws(self, op: dict[str, Any], result: Any, batch_size: int, epoch: bool) -> None:
        n = 1 if not epoch else self.batches_of(op, batch_size)
        if result is not None and self.track and len(result) != n:
            raise ModelError(f"{len(result)} batches, expected {n}")
        if epoch:
            self.begin_epoch()
        for b in range(n):
            self.draw(batch_size, None if result is None else result[b])

    def _op_sample(self, op: dict[str, Any], result: Any) -> None:
        self._draws(op, result, op["bs"], epoch=False)

    def _op_iterate(self, op: dict[str, Any], result: Any) -> None:
        self._draws(op, result, BATCH, epoch=True)

    def draw(self, batch_size: int, index: list[int] | None) -> None:
        """A batch drawn by ``sample``, an iteration or a DataLoader (checked, then kept)."""
        if self.cfg.sampler != "without":
            return
        if self.epoch_n is None or self.pos >= self.epoch_n:
            self.begin_epoch()
        assert self.epoch_n is not None
        k = min(batch_size, self.epoch_n - self.pos)
        if index is not None and self.track:
            if len(index) != k:
                raise ModelError(f"without replacement: {len(index)} indices drawn, expected {k}")
            seen = set(self.drawn)
            if len(set(index)) != k or seen & set(index):
                raise ModelError(
                    f"without replacement: {index} repeats an index of this epoch {self.drawn}"
                )
            if any(not 0 <= i < self.epoch_n for i in index):
                raise ModelError(f"without replacement: {index} outside the epoch's {self.epoch_n}")
            self.drawn += index
        self.pos += k

    def begin_epoch(self) -> None:
        if self.cfg.sampler == "without":
            self.epoch_n, self.pos, self.drawn = len(self.items), 0, []

    def epoch_batches(self, batch_size: int) -> int:
        """Batches of a fresh epoch (without replacement, drop_last=False)."""
        return -(-len(self.items) // batch_size)

    # --- storage lifecycle ----------------------------------------------------------------
    def _op_move_while_writing(self, op: dict[str, Any], result: Any) -> list[int]:
        """A thread ``add``s items one by one while the storage is pickled for another process.

        The pickle moves a TensorStorage's memory to shared memory (and shares a
        MemmapStorage): no add may be lost to the move.
        """
        if self.cfg.storage == "memmap" and not self.cow:
            self.shared = True  # pickled first, before the thread starts
        slots: list[int] = []
        for rank, done in zip(op["ranks"], op["dones"], strict=True):
            written = self.write(self.new_items([rank], [done]), single=True)
            slots.append(written[0] if written else -1)
        return slots

    def opener_can_join(self) -> bool | None:
        """Whether another process's ``open(path)`` joins the storage (``None``: no path)."""
        if self.cfg.storage == "memmap" and not self.cow:
            return self.shared  # unshared: refused, naming this process
        if self.cfg.storage == "arrow":
            return False  # one writer: this one
        return None

    def _op_open_elsewhere(self, op: dict[str, Any], result: Any) -> list[int] | None:
        """Another process opens the storage's path, extends it with a RoundRobinWriter, closes.

        Joined (the storage is shared): its items go at the shared ring cursor and this
        buffer's sampler hears of them; refused (``None``): nothing changes.
        """
        if not self.opener_can_join():
            return None
        items = self.new_items(op["ranks"], op["dones"])
        slots = [(self.next_slot + j) % CAP for j in range(len(items))]
        self._commit(slots, items)
        self._on_write(slots, items)
        return slots

    def _op_pickle(self, op: dict[str, Any], result: Any) -> None:
        if self.cfg.storage == "memmap" and not self.cow:
            self.shared = True  # pickling sends the path: the receiver may write too

    def _op_dataloader(self, op: dict[str, Any], result: Any) -> None:
        self._draws(op, result, op["bs"], epoch=True)
        if op["workers"] and self.cfg.storage == "memmap" and not self.cow:
            self.shared = True  # the storage was pickled for the workers

    def _op_fork_read(self, op: dict[str, Any], result: Any) -> None:
        if self.cfg.storage == "memmap" and not self.cow:
            self.shared = True  # os.register_at_fork marks live MemmapStorages shared

    def _op_share(self, op: dict[str, Any], result: Any) -> None:
        if self.cfg.storage == "memmap" and not self.cow:
            self.shared = True

    def _op_dumps(self, op: dict[str, Any], result: Any) -> None:
        self.ckpt = self.snapshot()

    def _restore(self, saved: Model, in_place: bool) -> None:
        """Take a checkpoint's (or state dict's) contents and component states."""
        keep = (self.shared, self.cow, self.reopenable, self.layout, self.ckpt, self.next_id)
        self.__dict__.update(copy.deepcopy(saved.__dict__))
        self.shared, self.cow, self.reopenable, layout, self.ckpt, self.next_id = keep
        self.pending = self.cursor is not None  # the writer's state loaded: a cursor to use
        if in_place:  # the buffer's own storage: its layout stays fixed (a list's follows)
            self.layout = saved.layout or (layout and self.cfg.storage != "list")

    def _op_loads(self, op: dict[str, Any], result: Any) -> None:
        assert self.ckpt is not None
        mode = op["mode"]
        self._restore(self.ckpt, in_place=mode == "load")
        if mode == "classmethod":  # a new storage: a private copy of the checkpoint's
            self.shared = False
            self.cow = self.cfg.storage == "memmap"
            self.reopenable = False
        elif mode == "fresh":  # a new buffer at a new path, loaded from the checkpoint
            self.shared, self.cow, self.reopenable = False, False, self.cfg.on_disk

    def _op_state_dict(self, op: dict[str, Any], result: Any) -> None:
        mode = op["mode"]
        self._restore(self.snapshot(), in_place=mode == "inplace")
        if mode == "from_state_dict":  # storage rebuilt in a temporary directory
            self.shared, self.cow, self.reopenable = False, False, False
        elif mode == "fresh":
            self.shared, self.cow, self.reopenable = False, False, self.cfg.on_disk

    def _op_reopen(self, op: dict[str, Any], result: Any) -> None:
        """``close`` + ``open`` and a new buffer with new components over the storage."""
        self.shared = False
        self.cursor, self.mv, self.pending = None, None, False
        self.prio, self.max_p = {}, 1.0
        self.epoch_n, self.pos, self.drawn = None, 0, []
        self.time, self.base, self.ends = 0, None, []
        self.attach()

    def attach(self) -> None:
        """What a new sampler learns when a buffer binds a storage that already holds items."""
        n = len(self.items)
        if not n:
            return
        if self.cfg.sampler == "prioritized":  # existing items get the default priority
            self.prio = {i: self.max_p for i in range(n)}
        elif self.cfg.sampler == "slice":  # episodes indexed in ring order from next_slot
            base = self.next_slot if n == CAP else 0
            slots = [(base + j) % CAP for j in range(n)]
            self._index_steps(slots, [self.items[s].done for s in slots])


#: the bad inputs the machine tries, and what the library must raise for each
BAD: dict[str, tuple[str, ...]] = {
    "extend_missing_key": ("ValueError",),
    "extend_extra_key": ("ValueError",),
    "extend_shape": ("ValueError",),
    "extend_dtype": ("TypeError",),
    "extend_batch_mismatch": ("ValueError",),
    "extend_too_many": ("ValueError",),  # round robin: a batch larger than the capacity
    "extend_nan_rank": ("ValueError",),  # max value
    "add_missing_key": ("ValueError",),
    "add_extra_key": ("ValueError",),
    "add_shape": ("ValueError",),
    "add_dtype": ("TypeError",),
    "add_nan_rank": ("ValueError",),  # max value
    "set_out_of_range": ("IndexError",),
    "set_negative_out_of_range": ("IndexError",),
    "set_count_mismatch": ("ValueError",),
    "set_missing_key": ("ValueError",),
    "priority_negative": ("ValueError",),
    "priority_nan": ("ValueError",),
    "priority_inf": ("ValueError",),
    "priority_overflow": ("ValueError",),
    "priority_index_high": ("ValueError",),
    "priority_index_negative": ("ValueError",),
    "priority_length_mismatch": ("ValueError",),
    "priority_no_sampler": ("TypeError",),  # update_priority without a PrioritizedSampler
    "sample_zero": ("ValueError",),
    "sample_negative": ("ValueError",),
    "sample_not_multiple": ("ValueError",),  # slice: batch size not a multiple of slice_len
}


def bad_kinds(model: Model) -> list[str]:
    """The bad inputs that apply to ``model``'s buffer in its current state."""
    cfg, kinds = model.cfg, []
    if model.layout:  # before the first write any layout is a valid one
        kinds += [k for k in BAD if k.startswith(("extend_", "add_")) and "nan" not in k]
        kinds.remove("extend_too_many")
        if model.items:
            kinds += [k for k in BAD if k.startswith("set_")]
    if cfg.writer == "round_robin":
        kinds.append("extend_too_many")
    else:
        kinds += ["extend_nan_rank", "add_nan_rank"]
    if cfg.sampler == "prioritized":
        if model.items:
            kinds += [k for k in BAD if k.startswith("priority_") and k != "priority_no_sampler"]
    else:
        kinds.append("priority_no_sampler")
    kinds += ["sample_zero", "sample_negative"]
    if cfg.sampler == "slice":
        kinds.append("sample_not_multiple")
    return kinds
