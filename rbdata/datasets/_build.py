"""What the converters share: row blocks into a storage, JSON metadata, streamed ``.npz`` files.

:func:`write_blocks` writes a stream of row blocks into a new storage directory, with bounded
memory. A converter (D4RL, Minari) yields *blocks*: dicts from flat key tuples (``("next",
"reward")``) to arrays whose leading dimension is the block's rows, in file order. The first
block fixes the layout; every block is validated against it before it is written. Memory holds
one block at a time: a memmap storage is written front to back with plain file writes
(:class:`~rbdata.storages.DirectoryWriter`), an Arrow storage chunk by chunk.

:func:`json_safe` turns source metadata into JSON: what ``dataset.json`` keeps of HDF5 and
Minari metadata.

:class:`NpzArchive` streams the arrays of an ``.npz`` archive row chunk by row chunk, never
loading one whole.

``np.load(path, mmap_mode="r")`` memory-maps a ``.npy`` file only: for an ``.npz`` (a zip
archive of ``.npy`` members) numpy ignores ``mmap_mode`` and every member access reads and
decompresses the whole array into memory. OGBench writes its files with
``np.savez_compressed`` (deflate members; ``data_gen_scripts/generate_*.py``), so they cannot
be mapped at all. It reads each member's ``.npy`` header (``numpy.lib.format``) from
the archive and then streams its data with :mod:`zipfile`, which decompresses incrementally:
memory holds the rows asked for, whatever the member's size, for stored (``np.savez``) and
deflated members alike. Reading a member to its end checks the zip's CRC-32 of it.

:func:`read_npy_header` and :class:`RowStream` read any file object, so a gzipped ``.npy``
(Dopamine's checkpoints, :mod:`rbdata.datasets.atari`) streams the same way.

Only plain numeric and boolean arrays in C order (or 1-D) are read: an object array would need
pickle, which is never used, and is refused like every other malformed member, with a
``ValueError`` naming the file and the member.
"""

from __future__ import annotations

import contextlib
import gzip
import os
import struct
import zipfile
import zlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import IO, Any

import numpy as np
import torch
from numpy.lib import format as npy_format
from tqdm.auto import tqdm

from rbdata._core.layout import Key, Layout
from rbdata.storages import DirectoryWriter
from rbdata.storages.arrow import ArrowStorage

__all__ = [
    "Block",
    "NpzArchive",
    "NpzMember",
    "RowStream",
    "json_safe",
    "read_npy_header",
    "write_blocks",
]


#: One block of rows: flat key tuples to arrays (or tensors) with the rows as leading dim.
Block = Mapping[Key, Any]


def _as_tensor(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        if not value.flags.writeable:  # torch warns on read-only arrays (e.g. from Arrow)
            return torch.from_numpy(value.copy())
        return torch.from_numpy(np.ascontiguousarray(value))
    return value


def write_blocks(
    blocks: Iterable[Block],
    rows: int,
    path: Path,
    backend: str,
    *,
    desc: str = "converting",
    progress: bool = True,
) -> Layout:
    """Write ``rows`` rows from ``blocks`` into a new ``backend`` storage at ``path``.

    Args:
        blocks: the row blocks, in order; together exactly ``rows`` rows.
        rows: the number of rows (the storage's capacity).
        path: the new storage directory.
        backend: ``"memmap"`` or ``"arrow"``.
        desc: label of the progress bar.
        progress: show a progress bar (tqdm, on stderr).

    Returns:
        The layout of the rows.

    Raises:
        ValueError: the blocks do not add up to ``rows`` rows, or a block's keys, shapes or
            dtypes differ from the first block's.
    """
    if rows <= 0:
        raise ValueError(f"the dataset has no transitions ({rows} rows)")
    layout: Layout | None = None
    writer: DirectoryWriter | ArrowStorage | None = None
    written = 0
    bar = tqdm(total=rows, desc=desc, unit="rows", unit_scale=True, disable=not progress)
    try:
        for block in blocks:
            data = {key: _as_tensor(value) for key, value in block.items()}
            if layout is None:
                layout = Layout.from_data(data, batched=True)
                if backend == "memmap":
                    writer = DirectoryWriter(path, rows, layout)
                else:
                    writer = ArrowStorage(rows, path=path)
            tensors, n = layout.split(data, batched=True)
            if written + n > rows:
                raise ValueError(f"the converter gave more than the {rows} rows it announced")
            for t, leaf in zip(tensors, layout.leaves, strict=True):
                if t.dtype != leaf.dtype:  # split lets safe casts through: store exactly
                    raise ValueError(f"key {leaf.name}: dtype {t.dtype}, expected {leaf.dtype}")
            if isinstance(writer, DirectoryWriter):
                writer.write(tensors)
            elif writer is not None:
                writer.set(slice(written, written + n), data)
            written += n
            bar.update(n)
        if written != rows or writer is None or layout is None:
            raise ValueError(f"the converter gave {written} rows, announced {rows}")
        writer.close()
        writer = None
        return layout
    finally:
        bar.close()
        if writer is not None:  # failed midway: release the files, the caller removes them
            with contextlib.suppress(Exception):
                if isinstance(writer, DirectoryWriter):
                    writer.abort()
                else:
                    writer.abort()


def json_safe(value: Any, special: Callable[[Any], Any] | None = None) -> Any:
    """``value`` as JSON: text decoded as UTF-8, numpy values as Python numbers or lists.

    Mappings keep their (stringified) keys, sets become sorted lists, and anything else
    becomes its ``str``. ``special`` may claim a value first (return non-``None``), e.g. to
    serialize gymnasium spaces.

    Examples:
        >>> json_safe({"algorithm": np.bytes_(b"SAC"), "w": np.zeros((1, 2), np.float32)})
        {'algorithm': 'SAC', 'w': [[0.0, 0.0]]}
        >>> json_safe({np.int64(3), np.int64(1)}), json_safe(np.bool_(True))
        ([1, 3], True)
    """
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if special is not None:
        claimed = special(value)
        if claimed is not None:
            return claimed
    if isinstance(value, Mapping):
        return {str(k): json_safe(v, special) for k, v in value.items()}
    if isinstance(value, (set, frozenset)):
        return sorted((json_safe(v, special) for v in value), key=repr)
    if isinstance(value, (list, tuple)):
        return [json_safe(v, special) for v in value]
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    if isinstance(value, np.ndarray):
        if value.dtype.kind in "biuf":  # tolist already gives Python numbers
            return value.tolist()
        return json_safe(value.tolist(), special)
    if isinstance(value, np.generic):
        return json_safe(value.item(), special)
    return str(value)


#: members are read in pieces of at most this many bytes (the zip reader's own buffer is small)
_READ_BYTES = 1 << 22
#: the kinds of dtypes read: bool, signed and unsigned integers, floats
_KINDS = "biuf"
#: what the zip, gzip and zlib readers raise on a corrupt or truncated archive or stream
_CORRUPT = (
    zipfile.BadZipFile,
    gzip.BadGzipFile,
    zlib.error,
    EOFError,
    struct.error,
    NotImplementedError,
)


@dataclass(frozen=True)
class NpzMember:
    """One array of the archive, from its ``.npy`` header (no data read).

    Attributes:
        name: its key (the member's file name without ``.npy``).
        shape: its shape; ``shape[0]`` is its rows (a 0-d array has none).
        dtype: its dtype, as stored (byte order included).
    """

    name: str
    shape: tuple[int, ...]
    dtype: np.dtype[Any]

    @property
    def row_bytes(self) -> int:
        """Bytes of one row (of the whole array for a 0-d one)."""
        return int(np.prod(self.shape[1:], dtype=np.int64)) * self.dtype.itemsize

    @property
    def rows(self) -> int:
        """Its number of rows (1 for a 0-d array)."""
        return self.shape[0] if self.shape else 1


def read_npy_header(fp: IO[bytes], where: str) -> tuple[tuple[int, ...], np.dtype[Any]]:
    """Read the ``.npy`` magic and header from ``fp``; refuse what is not a plain array."""
    try:
        version = npy_format.read_magic(fp)
        if version == (1, 0):
            shape, fortran, dtype = npy_format.read_array_header_1_0(fp)
        elif version in ((2, 0), (3, 0)):  # 3.0 differs in the text encoding of field names only
            shape, fortran, dtype = npy_format.read_array_header_2_0(fp)
        else:
            raise ValueError(f"unsupported .npy format version {version}")
    except _CORRUPT as err:
        raise ValueError(f"{where}: corrupt or truncated .npy header ({err})") from err
    except ValueError as err:
        raise ValueError(f"{where}: not a .npy array ({err})") from err
    if dtype.hasobject or dtype.kind not in _KINDS or dtype.fields is not None:
        raise ValueError(
            f"{where}: dtype {dtype} is not supported (bool, integer and float arrays only; "
            "object arrays would need pickle, which is never used)"
        )
    if fortran and len(shape) > 1:
        raise ValueError(f"{where}: a Fortran-order array of shape {shape} cannot be streamed")
    return tuple(int(s) for s in shape), dtype


class RowStream:
    """Sequential reader of one member's rows; :meth:`finish` checks that it ends there.

    Args:
        fp: the member's open file in the archive, at the start of its data.
        member: the member's header.
        where: ``"<file>: member <name>"`` for messages.
    """

    def __init__(self, fp: IO[bytes], member: NpzMember, where: str) -> None:
        self._fp = fp
        self.member = member
        self._where = where
        self._done = 0
        self._back: np.ndarray | None = None
        self._native = member.dtype.newbyteorder("=")

    @property
    def remaining(self) -> int:
        """Rows not read yet (pushed-back rows included)."""
        back = 0 if self._back is None else len(self._back)
        return self.member.rows - self._done + back

    def read(self, rows: int) -> np.ndarray:
        """The next ``rows`` rows (fewer at the end), native byte order, writable.

        Raises:
            ValueError: the member's data ends early or is corrupt (the message names it).
        """
        back = self._back
        self._back = None
        if back is None:
            return self._read_new(rows)
        if len(back) > rows:  # more pushed back than asked: keep the rest for later
            self._back = back[rows:]
            return back[:rows]
        rest = self._read_new(rows - len(back))
        return np.concatenate([back, rest]) if len(rest) else back

    def unread(self, rows: np.ndarray) -> None:
        """Push ``rows`` (the last ones read) back: the next :meth:`read` starts with them."""
        if len(rows):
            self._back = rows if self._back is None else np.concatenate([rows, self._back])

    def _read_new(self, rows: int) -> np.ndarray:
        rows = max(0, min(rows, self.member.rows - self._done))
        shape = (rows, *self.member.shape[1:]) if self.member.shape else ()
        out = np.empty(shape, self._native)
        view = out.reshape(-1).view(np.uint8).data  # writes land in ``out``
        need, got = len(view), 0
        try:
            while got < need:
                piece = self._fp.read(min(_READ_BYTES, need - got))
                if not piece:
                    break
                view[got : got + len(piece)] = piece
                got += len(piece)
        except _CORRUPT as err:
            raise ValueError(f"{self._where}: corrupt or truncated data ({err})") from err
        if got != need:
            raise ValueError(
                f"{self._where}: truncated: the data ends {need - got} bytes early "
                f"(shape {self.member.shape})"
            )
        self._done += rows
        if self.member.dtype.byteorder not in ("=", "|", "<" if _LITTLE else ">"):
            out = out.view(self.member.dtype).astype(self._native)  # a foreign byte order
        return out

    def finish(self) -> None:
        """Check that the member's data ends after its last row (and its CRC-32 with it).

        Raises:
            ValueError: rows were not read, bytes follow the data, or the CRC differs.
        """
        if self.remaining:
            raise ValueError(f"{self._where}: {self.remaining} rows were not read")
        try:
            extra = self._fp.read(1)
        except _CORRUPT as err:
            raise ValueError(f"{self._where}: corrupt data ({err})") from err
        if extra:
            raise ValueError(f"{self._where}: bytes follow the array's data (corrupt member)")

    def close(self) -> None:
        """Close the member's file."""
        self._fp.close()


_LITTLE = np.little_endian


class NpzArchive:
    """An ``.npz`` file opened for streaming: its members' headers, and row streams.

    Args:
        path: the ``.npz`` file.

    Raises:
        ValueError: not a zip archive, or a member that is not a plain ``.npy`` array (the
            message names the file and the member).

    Examples:
        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     file = Path(tmp, "a.npz")
        ...     np.savez_compressed(file, x=np.arange(10, dtype=np.int16).reshape(5, 2))
        ...     with NpzArchive(file) as npz:
        ...         stream = npz.open("x")
        ...         first, rest = stream.read(2), stream.read(9)
        ...         stream.finish()
        ...         stream.close()
        >>> first.tolist(), rest.shape, npz.members["x"].shape
        ([[0, 1], [2, 3]], (3, 2), (5, 2))
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        try:
            self._zip = zipfile.ZipFile(self.path)
        except (*_CORRUPT, OSError) as err:
            if isinstance(err, FileNotFoundError):
                raise
            raise ValueError(f"{self.path}: not an .npz (zip) archive ({err})") from err
        try:
            self.members = self._read_members()
        except BaseException:
            self._zip.close()
            raise

    def _read_members(self) -> dict[str, NpzMember]:
        members: dict[str, NpzMember] = {}
        for info in self._zip.infolist():
            if info.is_dir():
                continue
            where = f"{self.path}: member {info.filename!r}"
            if not info.filename.endswith(".npy"):
                raise ValueError(f"{where}: not an .npy array (an .npz holds .npy members)")
            name = info.filename[: -len(".npy")]
            if name in members:
                raise ValueError(f"{where}: the archive holds it twice")
            try:
                with self._zip.open(info) as fp:
                    shape, dtype = read_npy_header(fp, where)
            except _CORRUPT as err:
                raise ValueError(f"{where}: corrupt member ({err})") from err
            members[name] = NpzMember(name, shape, dtype)
        return members

    def open(self, name: str) -> RowStream:
        """A stream of member ``name``'s rows, positioned after its header."""
        member = self.members[name]
        where = f"{self.path}: member {name!r}"
        try:
            fp = self._zip.open(name + ".npy")
            read_npy_header(fp, where)
        except _CORRUPT as err:
            raise ValueError(f"{where}: corrupt member ({err})") from err
        return RowStream(fp, member, where)

    def read_small(self, name: str, limit: int = 1 << 20) -> np.ndarray:
        """The whole of a small member (at most ``limit`` bytes, e.g. a 0-d scalar).

        Raises:
            ValueError: the member is larger than ``limit``, or corrupt.
        """
        member = self.members[name]
        size = member.row_bytes * (member.shape[0] if member.shape else 1)
        if size > limit:
            raise ValueError(f"{self.path}: member {name!r} has {size} bytes, over {limit}")
        stream = self.open(name)
        try:
            value = stream.read(member.rows)
            stream.finish()
        finally:
            stream.close()
        return value

    def close(self) -> None:
        """Close the archive."""
        self._zip.close()

    def __enter__(self) -> NpzArchive:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()
