"""The per-step ``add`` path: one item's leaves, checked and ready for numpy row writes.

An online agent writes one transition per environment step, usually a dict of numpy arrays,
numpy scalars and Python numbers. The general write path (:meth:`Layout.split
<rbdata._core.layout.Layout.split>`) turns every leaf into a tensor and checks it, ~10-30 us per
item; a numpy row assignment costs ~0.1-0.5 us per leaf. :class:`ItemUnpacker` reads an item
whose leaves *already* match the layout exactly (same keys, shapes and dtypes, or Python
numbers that the leaf's dtype holds) and returns them in layout order, ready to assign to
rows of numpy views of the storage. Anything else (another dtype needing a checked cast, a
tensor on another device or sparse; a missing or unknown key; any doubt) returns ``None``
and the item takes the general path, which raises the documented errors or converts. The two
paths accept the same items and store the same values: the fast path only takes items for
which the general path's checks are known to pass and its casts exact.

A tensor leaf of a few elements is read as Python numbers (``tolist()``, exact for every
dtype with a numpy twin, ~0.2 us) rather than viewed through ``numpy()`` (~0.7 us); the one
difference is that a signalling NaN arrives quiet.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from tensordict import TensorDict

from rbdata._core.layout import TENSOR, Layout, Leaf, nest

__all__ = ["ItemUnpacker", "numpy_views"]

_INT64 = (-(2**63), 2**63 - 1)


def _numpy_dtype(dtype: torch.dtype) -> np.dtype[Any] | None:
    try:
        return torch.empty(0, dtype=dtype).numpy().dtype
    except (TypeError, RuntimeError):  # bfloat16, quantized...: no numpy twin
        return None


def _python_numbers(leaf: Leaf) -> tuple[tuple[type, ...], tuple[float, float]]:
    """The Python number types a scalar leaf takes as they are, and the bounds of a float.

    They follow the general path, which turns a Python number into a tensor
    (``bool`` -> bool, ``int`` -> int64, ``float`` -> float32, torch's default dtype) and
    casts it, so only numbers that numpy's assignment stores identically are taken: a bool
    into any leaf; an int into an integer leaf within its range, or into a float leaf where
    the float holds it exactly; a float into a float32 leaf when it stays finite (NaN, the
    infinities and floats into other float dtypes take the general path).
    """
    dtype = leaf.dtype
    if leaf.shape or dtype.is_complex:
        return (), (0, 0)
    if dtype is torch.bool:
        return (bool,), (0, 0)
    if dtype is torch.float32:
        top = float(torch.finfo(dtype).max)
        return (bool, int, float), (-top, top)
    return (bool, int), (0, 0)


def _int_range(leaf: Leaf, np_dtype: np.dtype[Any]) -> tuple[int, int]:
    """The ints a leaf takes as they are: its range, or those its float type holds exactly."""
    dtype = leaf.dtype
    if dtype.is_floating_point:
        exact = 2 ** (int(np.finfo(np_dtype).nmant) + 1)  # e.g. 2**24 for float32
        return -exact, exact
    if dtype.is_complex or dtype is torch.bool:
        return 0, -1  # none
    info = torch.iinfo(dtype)
    return max(info.min, _INT64[0]), min(info.max, _INT64[1])


_MISS = object()
# what reading a tensor leaf may raise: the general path takes it (and raises, or converts)
_REFUSED = (RuntimeError, TypeError, ValueError, NotImplementedError)
_SMALL = 8  # a tensor leaf of at most this many elements is read with tolist(), not numpy()


class _Spec:
    """What one leaf accepts on the fast path."""

    __slots__ = (
        "dtype",
        "float_range",
        "index",
        "int_range",
        "np_dtype",
        "np_scalar",
        "numbers",
        "shape",
        "small",
    )

    def __init__(self, index: int, leaf: Leaf, np_dtype: np.dtype[Any]) -> None:
        self.index = index
        self.dtype = leaf.dtype
        self.np_dtype = np_dtype
        self.np_scalar = np_dtype.type if not leaf.shape else None
        self.shape = tuple(leaf.shape)
        self.small = leaf.numel <= _SMALL
        self.numbers, self.float_range = _python_numbers(leaf)
        self.int_range = _int_range(leaf, np_dtype)


def _tree(layout: Layout, specs: list[_Spec]) -> list[tuple[str, Any]]:
    """The nested key structure: ``[(key, _Spec | subtree)]`` in first-appearance order."""
    root = nest(zip(layout.keys, specs, strict=True))

    def freeze(node: dict[str, Any]) -> list[tuple[str, Any]]:
        return [(k, freeze(v) if isinstance(v, dict) else v) for k, v in node.items()]

    return freeze(root)


# --- the readers, generated per layout -------------------------------------------------------
# One straight-line function per layout: no loop over the key tree, no call per leaf. The
# source holds only fixed statements and numbered names; keys, dtypes, shapes and bounds are
# bound in its namespace, so no user string ever becomes code.


class _Source:
    """The lines and namespace of a generated reader."""

    def __init__(self) -> None:
        self.nodes = self.leaves = 0
        self.lines: list[str] = []
        self.names: dict[str, Any] = {
            "MISS": _MISS,
            "ndarray": np.ndarray,
            "Tensor": torch.Tensor,
            "TensorDict": TensorDict,
            "STRIDED": torch.strided,
            "REFUSED": _REFUSED,
        }

    def first(self) -> bool:
        """Whether no batch leaf was read yet (it sets the batch size)."""
        self.leaves += 1
        return self.leaves == 1

    def node(self) -> str:
        """A fresh local name for a dict-like node."""
        self.nodes += 1
        return f"n{self.nodes}"

    def bind(self, prefix: str, value: Any) -> str:
        name = f"{prefix}{len(self.names)}"
        self.names[name] = value
        return name

    def emit(self, depth: int, line: str) -> None:
        self.lines.append("    " * depth + line)


def _emit_leaf(src: _Source, spec: _Spec, out: str, flat: bool) -> None:
    """Statements that set ``out`` from ``v`` (one item's value of the leaf) or return.

    ``flat``: a numpy array leaf is read as Python numbers too (``tolist()``).
    """
    emit = src.emit
    dtype, np_dtype = src.bind("T", spec.dtype), src.bind("D", spec.np_dtype)
    shape = src.bind("S", spec.shape)
    emit(1, "k = type(v)")
    branch = "if"
    if spec.np_scalar is not None:  # a scalar leaf: the Python numbers first, then numpy's
        for kind in sorted(spec.numbers, key=lambda t: t is not _likely(spec)):
            emit(1, f"{branch} k is {kind.__name__}:")
            if kind is not bool:
                lo, hi = spec.int_range if kind is int else spec.float_range
                emit(2, f"if not {src.bind('L', lo)} <= v <= {src.bind('H', hi)}:")
                emit(3, "return None  # out of range, or NaN: the general path decides")
            emit(2, f"{out} = v")
            branch = "elif"
        emit(1, f"{branch} k is {src.bind('N', spec.np_scalar)}:")
        emit(2, f"{out} = v")
        branch = "elif"
    emit(1, f"{branch} k is ndarray:")
    emit(2, f"if v.dtype is not {np_dtype} or v.shape != {shape}:")
    emit(3, "return None")
    emit(2, f"{out} = v.tolist()" if flat else f"{out} = v")
    emit(1, "elif k is Tensor:")
    # numpy() refuses what a plain copy of the bytes would get wrong or must not touch
    # (autograd, a conjugate or negative bit, another device, a sparse layout); tolist()
    # reads the values (exact in Python numbers) and is cheaper for a few elements
    emit(2, "try:")
    if spec.shape:
        emit(3, f"if v.dtype is not {dtype} or v.layout is not STRIDED or v.shape != {shape}:")
        emit(4, "return None")
        emit(3, f"{out} = v.{'tolist' if spec.small else 'numpy'}()")
    else:  # a 0-d tensor's tolist() is a number, any other's a list: no dim() needed
        emit(3, f"if v.dtype is not {dtype} or v.layout is not STRIDED:")
        emit(4, "return None")
        emit(3, f"{out} = v.tolist()")
        emit(3, f"if type({out}) is list:")
        emit(4, "return None")
    emit(2, "except REFUSED:")
    emit(3, "return None")
    emit(1, "else:")
    emit(2, "return None")


def _emit_batch_leaf(src: _Source, spec: _Spec, out: str, first: bool) -> None:
    """Statements that set ``out`` from ``v`` (a batch of the leaf) or return.

    Numpy arrays and tensors that ``numpy()`` views, of the leaf's dtype and per-item shape,
    with the batch size ``size`` of the first leaf.
    """
    emit = src.emit
    emit(1, "if type(v) is Tensor:")
    emit(2, "try:")
    emit(3, "v = v.numpy()")
    emit(2, "except REFUSED:")
    emit(3, "return None")
    emit(1, "elif type(v) is not ndarray:")
    emit(2, "return None")
    emit(1, "s = v.shape")
    np_dtype, shape = src.bind("D", spec.np_dtype), src.bind("S", spec.shape)
    emit(1, f"if not s or v.dtype is not {np_dtype} or s[1:] != {shape}:")
    emit(2, "return None")
    if first:
        emit(1, "size = s[0]")
    else:
        emit(1, "if s[0] != size:")
        emit(2, "return None")
    emit(1, f"{out} = v")


def _likely(spec: _Spec) -> type:
    """The Python number type a scalar leaf most likely gets (tried first)."""
    if spec.dtype is torch.bool:
        return bool
    return float if spec.dtype.is_floating_point else int


def _emit_node(
    src: _Source,
    node: str,
    tree: list[tuple[str, Any]],
    outs: list[str],
    batch: bool,
    top: bool,
    flat: bool,
) -> None:
    """Statements that take ``v`` as the dict-like ``node`` and read its leaves into ``outs``.

    A TensorDict node has no batch dimension (an item), or one (the top of a batch), or some
    (a sub-TensorDict of a batch); a dict is taken as it is.
    """
    emit = src.emit
    emit(1, "k = type(v)")
    emit(1, "if k is dict:")
    emit(2, f"{node} = v")
    dims = "len(v._batch_size) == 1" if top else "v._batch_size"
    emit(1, f"elif k is TensorDict and {dims if batch else 'not v._batch_size'}:")
    emit(2, f"{node} = v._tensordict")
    emit(1, "else:")
    emit(2, "return None")
    emit(1, f"if len({node}) != {len(tree)}:")
    emit(2, "return None  # a key missing or one too many")
    for key, sub in tree:
        emit(1, f"v = {node}.get({src.bind('K', key)}, MISS)")
        if type(sub) is not _Spec:
            _emit_node(src, src.node(), sub, outs, batch, top=False, flat=flat)
        elif batch:
            _emit_batch_leaf(src, sub, outs[sub.index], first=src.first())
        else:
            _emit_leaf(src, sub, outs[sub.index], flat)


def _compile(layout: Layout, specs: list[_Spec], batch: bool, flat: bool = False) -> Any:
    """The generated reader of one item (``batch=False``) or of a batch, for ``layout``.

    ``flat`` (an item of leaves of at most one dimension): the values of every leaf in one
    flat tuple of Python and numpy numbers, in layout order (for ``struct.pack``).
    """
    src = _Source()
    outs = [f"x{spec.index}" for spec in specs]
    src.emit(0, "def read(v):")
    if layout.kind == "tensor" and batch:
        _emit_batch_leaf(src, specs[0], outs[0], first=True)
    elif layout.kind == "tensor":
        _emit_leaf(src, specs[0], outs[0], flat)
    else:
        _emit_node(src, "n", _tree(layout, specs), outs, batch, top=True, flat=flat)
    if batch:
        src.emit(1, "if size < 1:")
        src.emit(2, "return None")
    if flat:  # a 1-D leaf's list is spread, a scalar leaf's number taken as it is
        stars = ("*" if spec.shape else "" for spec in specs)
        result = f"({', '.join(star + out for star, out in zip(stars, outs, strict=True))},)"
    else:
        result = f"[{', '.join(outs)}]"
    src.emit(1, f"return {result}, size" if batch else f"return {result}")
    namespace = dict(src.names)
    exec(
        compile(
            "\n".join(src.lines),
            "<rbdata batch reader>" if batch else "<rbdata item reader>",
            "exec",
        ),
        namespace,
    )
    return namespace["read"]


class ItemUnpacker:
    """Unpack one item that matches a fixed layout exactly into numpy-assignable leaves.

    Build it with :meth:`for_layout` (``None`` where a layout has no numpy twin). Then
    :attr:`unpack` returns the leaves in layout order (numpy arrays, numpy scalars, Python
    numbers and lists of them, or numpy views of CPU tensors) or ``None`` for the general
    path. It is a function generated for the layout (see ``_compile``); so is :attr:`unpack_batch`.

    Examples:
        >>> import numpy as np, torch
        >>> from rbdata._core.layout import Layout
        >>> item = {"obs": torch.zeros(3), "next": {"r": torch.zeros(())}}
        >>> layout = Layout.from_data(item, batched=False)
        >>> unpack = ItemUnpacker.for_layout(layout).unpack
        >>> unpack({"obs": np.ones(3, np.float32), "next": {"r": 1.5}})
        [array([1., 1., 1.], dtype=float32), 1.5]
        >>> unpack({"obs": torch.ones(3), "next": {"r": torch.tensor(0.5)}})
        [[1.0, 1.0, 1.0], 0.5]
        >>> unpack({"obs": np.ones(3), "next": {"r": 1.5}}) is None  # float64: general path
        True
    """

    def __init__(self, layout: Layout, specs: list[_Spec]) -> None:
        self.unpack: Any = _compile(layout, specs, batch=False)
        """``unpack(item)``: the leaves of ``item`` in layout order, or ``None``."""
        self.unpack_flat: Any = None
        """``unpack_flat(item)``: every leaf's values in one flat tuple, or ``None``.

        Only for layouts whose leaves are small (``tolist()`` reads them) and at most 1-D:
        ``None`` otherwise.
        """
        if all(spec.small and len(spec.shape) <= 1 for spec in specs):
            self.unpack_flat = _compile(layout, specs, batch=False, flat=True)
        self.unpack_batch: Any = _compile(layout, specs, batch=True)
        """``unpack_batch(data)``: the leaves of a batch in layout order and its size ``n``.

        Numpy arrays and CPU tensors of the leaf's dtype and per-item shape with a leading
        dimension ``n >= 1`` (no Python numbers); ``None``: take the general path.
        """

    @classmethod
    def for_layout(cls, layout: Layout) -> ItemUnpacker | None:
        """An unpacker for ``layout`` (``None``: a leaf is variable or has no numpy dtype)."""
        specs = []
        for i, leaf in enumerate(layout.leaves):
            np_dtype = _numpy_dtype(leaf.dtype) if leaf.kind == TENSOR and leaf.numel else None
            if np_dtype is None:
                return None
            specs.append(_Spec(i, leaf, np_dtype))
        if not specs:
            return None
        return cls(layout, specs)


def numpy_views(payload: list[Any]) -> list[Any] | None:
    """Numpy views of one prepared item's tensors (``None``: one needs the torch path)."""
    try:
        return [t.numpy() for t in payload]
    except (RuntimeError, TypeError, AttributeError):  # grad, CUDA, a conjugate bit...
        return None
