"""The directory of a :class:`~rbdata.storages.FrameStackStorage` (``path=``, checkpoints).

::

    frames.json   format, version, id, capacity, stack, key, codec, the layout (``null``
                  until the first write), the generation of the compressed files, and the
                  counts recorded by the last flush, close or dump (``rbdata inspect``)
    steps/        a MemmapStorage directory: every step's other fields and frame refs
    frames/       raw: frames.bin, ``slots x frame bytes``;
                  compressed: log-G.bin (the blobs) and table-G.bin (``slots x 2`` int64:
                  each slot's blob offset and length) of generation ``G``

Every frame file starts with a 64-byte header: a :mod:`rbdata._core.ids` trailer (a magic naming
the kind of file, the directory's id, the generation) padded with zeros, so a file swapped
in from another storage, checkpoint or generation is refused when it is opened. The data
follows the header; its size gives the slots (or the log's bytes): the files grow as frames
are written, ``frames.json`` is rewritten only when the layout is fixed, a compaction
switches the generation, and on flush, close or dump.

No torch is imported here: ``frames.json`` is read with its layout as a metadata record
(:class:`~rbdata._core.spec.LayoutSpec`), for the storage and for ``rbdata inspect`` alike.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rbdata._core.checked import plain_file
from rbdata._core.files import atomic_write_json, inside, open_nofollow, read_meta
from rbdata._core.ids import TRAILER_BYTES, id_trailer, read_trailer
from rbdata._core.spec import DICT_KIND, DTYPES, TENSOR, LayoutSpec
from rbdata.errors import CheckpointError
from rbdata.storages._describe import StorageInfo, key_infos
from rbdata.storages.kinds import DiskKind, disk_kind

if TYPE_CHECKING:
    from rbdata._core.layout import Layout

__all__ = [
    "CODECS",
    "FRAMES_DIR",
    "HEADER",
    "META_FILE",
    "STEPS_DIR",
    "FramesMeta",
    "check_files",
    "check_header",
    "describe_dir",
    "frame_units",
    "data_files",
    "header",
    "read_frames_meta",
    "write_frames_meta",
]

FORMAT = "rbdata.frames"
VERSION = 1
META_FILE = "frames.json"
STEPS_DIR = "steps"
FRAMES_DIR = "frames"
#: bytes before a frame file's data
HEADER = 64
#: the magic of each kind of frame file
MAGIC = {"frames": b"RBDFRAW1", "log": b"RBDFLOG1", "table": b"RBDFTBL1"}
_ID = re.compile(r"[0-9a-f]{32}")
#: the per-frame codecs (``_codecs``)
CODECS = ("lz4", "zstd")


def data_files(codec: bool, generation: int) -> dict[str, str]:
    """The frame files' names by kind: ``frames``, or ``log`` and ``table`` of a generation."""
    if not codec:
        return {"frames": "frames.bin"}
    return {"log": f"log-{generation}.bin", "table": f"table-{generation}.bin"}


def header(kind: str, ident: str, generation: int) -> bytes:
    """The 64 bytes that start a frame file of ``kind`` (see the module docstring)."""
    return id_trailer(MAGIC[kind], ident, generation).ljust(HEADER, b"\0")


def check_header(found: bytes, kind: str, ident: str, generation: int, path: Path) -> None:
    """Raise ``ValueError`` naming ``path`` unless ``found`` is its expected header."""
    if found == header(kind, ident, generation):
        return
    read = read_trailer(found[:TRAILER_BYTES], MAGIC[kind])
    if read is None or found[TRAILER_BYTES:] != bytes(HEADER - TRAILER_BYTES):
        raise ValueError(f"{path}: no valid frame-file header (corrupt, or not a {kind} file)")
    other, gen = read
    if other != ident:
        raise ValueError(
            f"{path}: belongs to another storage (id {other}, frames.json says {ident}); a file "
            "swapped in from another storage directory or checkpoint"
        )
    raise ValueError(f"{path}: of generation {gen}, frames.json says {generation}")


def check_stacks(layout: Layout | LayoutSpec, key: tuple[str, ...], stack: int) -> None:
    """Refuse a layout without both stacks of ``key``, or with stacks of another shape or dtype.

    Raises:
        TypeError: the layout is not dict-like.
        ValueError: naming the key that is missing or wrong.
    """
    next_key = ("next", *key)
    names = f"{key!r} and {next_key!r}"
    if layout.kind != DICT_KIND:
        raise TypeError(f"FrameStackStorage stores dict-like transitions with {names}")
    leaves = {leaf.key: leaf for leaf in layout.leaves}
    obs, nxt = leaves.get(key), leaves.get(next_key)
    if obs is None or nxt is None:
        missing = key if obs is None else next_key
        raise ValueError(
            f"key {missing!r}: FrameStackStorage needs the stacks {names} in every write"
        )
    for leaf in (obs, nxt):
        if leaf.kind != TENSOR or len(leaf.shape) not in (3, 4):
            raise ValueError(
                f"key {leaf.key!r}: a stack is [stack, H, W] or [stack, H, W, C] per step, "
                f"got {list(leaf.shape)}"
            )
        if leaf.shape[0] != stack:
            raise ValueError(
                f"key {leaf.key!r}: stacks of {stack} frames expected (stack={stack}), got "
                f"{leaf.shape[0]}"
            )
    if (obs.shape, obs.dtype) != (nxt.shape, nxt.dtype):
        raise ValueError(
            f"keys {names}: the stacks differ ({obs.dtype} {list(obs.shape)} vs "
            f"{nxt.dtype} {list(nxt.shape)})"
        )


@dataclass(frozen=True)
class FramesMeta:
    """What ``frames.json`` says (checked by :func:`read_frames_meta`)."""

    ident: str
    capacity: int
    stack: int
    key: tuple[str, ...]
    codec: str | list[Any] | None
    #: the layout as a metadata record (``Layout.from_spec`` makes it the storage's)
    layout: LayoutSpec | None = None
    generation: int = 0
    #: frames stored and their bytes (blobs, or raw frames) at the last flush, close or dump
    frames: int | None = None
    frame_data: int | None = None

    @property
    def frame(self) -> tuple[tuple[int, ...], str] | None:
        """One frame's shape and dtype name (``None`` before the first write)."""
        if self.layout is None:
            return None
        leaf = next(leaf for leaf in self.layout.leaves if leaf.key == self.key)
        return tuple(leaf.shape[1:]), leaf.dtype

    @property
    def frame_bytes(self) -> int:
        """One raw frame's bytes (0 before the first write)."""
        frame = self.frame
        return 0 if frame is None else math.prod(frame[0]) * DTYPES[frame[1]].itemsize

    def files(self) -> dict[str, str]:
        """The frame files this metadata names (none before the first write)."""
        return {} if self.layout is None else data_files(self.codec is not None, self.generation)

    def with_(self, **changes: Any) -> FramesMeta:
        """A copy with ``changes``."""
        return replace(self, **changes)

    def to_json(self) -> dict[str, Any]:
        """The JSON object of ``frames.json``."""
        return {
            "format": FORMAT,
            "version": VERSION,
            "id": self.ident,
            "capacity": self.capacity,
            "stack": self.stack,
            "key": list(self.key),
            "codec": self.codec,
            "layout": None if self.layout is None else self.layout.to_json(),
            "generation": self.generation,
            "frames": self.frames,
            "frame_data": self.frame_data,
        }

    @classmethod
    def from_json(cls, meta: dict[str, Any], file: Path) -> FramesMeta:
        """Check every field of a parsed ``frames.json``.

        Raises:
            ValueError: naming ``file`` and the field.
        """

        def bad(field: str, expected: str) -> ValueError:
            return ValueError(
                f"{file}: field {field!r} is {meta.get(field)!r:.80}, expected {expected}"
            )

        def integer(field: str, low: int, optional: bool = False) -> Any:
            value = meta.get(field)
            if optional and value is None:
                return None
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise bad(field, f"an integer >= {low}")
            return value

        ident = meta.get("id")
        if not isinstance(ident, str) or not _ID.fullmatch(ident):
            raise bad("id", "32 hex digits")
        key = meta.get("key")
        if not isinstance(key, list) or not key or not all(isinstance(k, str) and k for k in key):
            raise bad("key", "a non-empty list of names")
        codec = meta.get("codec")
        if not (
            codec is None
            or codec in CODECS
            or (isinstance(codec, list) and len(codec) == 2 and codec[0] == "zstd"
                and isinstance(codec[1], int) and not isinstance(codec[1], bool))
        ):  # fmt: skip
            raise bad("codec", "null, 'lz4', 'zstd' or ['zstd', level]")
        out = cls(
            ident, integer("capacity", 1), integer("stack", 1), tuple(key), codec,
            None, integer("generation", 0), integer("frames", 0, True),
            integer("frame_data", 0, True),
        )  # fmt: skip
        layout = meta.get("layout")
        if layout is None:
            return out
        try:
            parsed = LayoutSpec.from_json(layout)
            check_stacks(parsed, out.key, out.stack)
        except (KeyError, TypeError, ValueError, AttributeError) as err:
            raise bad(
                "layout", f"a layout with both stacks ({type(err).__name__}: {err})"
            ) from None
        return out.with_(layout=parsed)


def read_frames_meta(root: Path) -> FramesMeta:
    """``root/frames.json``, every field checked (no symlink followed).

    Raises:
        FileNotFoundError: ``root`` holds no ``frames.json``.
        ValueError: naming the file and the field that is wrong.
    """
    raw = read_meta(root, META_FILE, FORMAT, VERSION, "FrameStackStorage directory")
    return FramesMeta.from_json(raw, root / META_FILE)


# --- what ``describe`` and ``rbdata inspect`` read --------------------------------------------
def _memmap_kind() -> DiskKind:
    kind = disk_kind("memmap")
    assert kind is not None  # a built-in kind
    return kind


def frame_units(meta: FramesMeta) -> dict[str, int]:
    """Each frame file's row bytes, by kind (``frames``, or ``log`` and ``table``)."""
    return {"frames": meta.frame_bytes, "log": 1, "table": 16}


def check_files(root: Path, meta: FramesMeta, problems: list[str] | None) -> None:
    """Every frame file the metadata names: a plain file, whole rows, this directory's header.

    ``problems``: collect what is wrong (``describe``); ``None``: raise ``CheckpointError``.
    """
    units = frame_units(meta)
    for kind, name in meta.files().items():
        path = root / FRAMES_DIR / name
        try:
            size = plain_file(path, "storage").st_size
            if size < HEADER or (size - HEADER) % units[kind]:
                raise CheckpointError(
                    f"{path}: {size} bytes, expected a {HEADER}-byte header and whole "
                    f"{units[kind]}-byte rows; truncated or corrupt"
                )
            with open_nofollow(path, "rb") as f:
                found = f.read(HEADER)
            try:
                check_header(found, kind, meta.ident, meta.generation, path)
            except ValueError as err:
                raise CheckpointError(str(err)) from None
        except CheckpointError as err:
            if problems is None:
                raise
            problems.append(str(err))


def describe_dir(root: Path) -> tuple[StorageInfo, list[str]]:
    """``frames.json`` and the steps' metadata; frame files by size and header (64 bytes)."""
    meta = read_frames_meta(root)
    steps_dir = inside(root, STEPS_DIR, "steps directory")
    steps, problems = _memmap_kind().describe(steps_dir)  # the steps' own format
    problems = [f"{STEPS_DIR}/{p}" for p in problems]
    check_files(root, meta, problems)
    details: dict[str, Any] = {"stack": meta.stack, "codec": meta.codec or "none"}
    if meta.frame is not None:
        shape, dtype = meta.frame
        details["frame"] = f"{list(shape)} {str(dtype).removeprefix('torch.')}"
    if meta.frames is not None and meta.frame_data is not None:
        details["frames_stored"] = f"{meta.frames:,} (at the last flush, close or dump)"
        if steps.length:
            per_step = (meta.frame_data + steps.length * _step_bytes(steps)) / steps.length
            details["bytes_per_step"] = f"{per_step:,.0f} (frames and the other fields)"
    for key, value in steps.details.items():
        details[f"steps_{key}"] = value
    if steps.capacity != meta.capacity:
        problems.append(f"{STEPS_DIR}: capacity {steps.capacity}, {META_FILE} says {meta.capacity}")
    info = StorageInfo(
        "frames", meta.capacity, steps.length, steps.next_slot, key_infos(meta.layout), details
    )
    return info, problems


def _step_bytes(steps: StorageInfo) -> int:
    """Bytes of one step's other fields and refs (from the steps' keys)."""
    total = 0
    for key in steps.keys:
        dtype = DTYPES.get(key.dtype, DTYPES["uint8"])
        total += math.prod(key.shape) * dtype.itemsize
    return total


def write_frames_meta(root: Path, meta: FramesMeta, fsync: bool = True) -> None:
    """Replace ``root/frames.json`` atomically."""
    atomic_write_json(root / META_FILE, meta.to_json(), fsync)
