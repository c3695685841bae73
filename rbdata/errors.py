"""Exceptions raised by rbdata.

Bad input raises the built-in exception a Python user expects (``ValueError``,
``TypeError``, ``IndexError``); the classes here cover the cases that have no
natural built-in.
"""

from __future__ import annotations

__all__ = [
    "CheckpointError",
    "ChecksumError",
    "DownloadError",
    "EmptyBufferError",
    "IndexOutOfRangeError",
    "MissingExtraError",
    "MissingKeyError",
    "ReadOnlyError",
    "StorageInUseError",
]


class CheckpointError(ValueError):
    """Raised when a checkpoint directory is missing, incomplete, tampered with or foreign."""


class IndexOutOfRangeError(IndexError, ValueError):
    """Raised for an index outside the items a buffer, a mixture or a sampler holds.

    Both an ``IndexError`` (as ``rb[index]`` and ``mixed[index]`` raise it) and a
    ``ValueError`` (as ``update_priority`` refused a bad index before): ``except IndexError``
    and ``except ValueError`` both catch it, from :class:`~rbdata.ReplayBuffer`,
    :class:`~rbdata.MixedBuffer` and every prioritized sampler alike.

    Examples:
        >>> err = IndexOutOfRangeError("index: 7 is outside the filled range [0, 3)")
        >>> isinstance(err, IndexError), isinstance(err, ValueError)
        (True, True)
    """


class EmptyBufferError(RuntimeError):
    """Raised when sampling from a buffer or storage that holds no items."""


class ReadOnlyError(RuntimeError):
    """Raised on a write to a read-only buffer (``ImmutableWriter``)."""


class StorageInUseError(RuntimeError):
    """Raised when a storage directory is opened while another process holds it unshared.

    The message names the process and says how to share the storage (``storage.share()``
    there, or sending the storage object, which pickling and forking share).
    """


class MissingKeyError(KeyError):
    """Raised when a key (or a dataset name) is not there; a ``KeyError`` that reads well.

    ``str(KeyError(msg))`` is ``repr(msg)``, so a message quoting a key would print with
    escaped quotes; this one prints its message as written. ``except KeyError`` catches it.

    Examples:
        >>> str(MissingKeyError("the storage has no key 'obs'"))
        "the storage has no key 'obs'"
    """

    def __str__(self) -> str:
        args = self.args
        return args[0] if len(args) == 1 and isinstance(args[0], str) else super().__str__()


class MissingExtraError(ImportError):
    """Raised when an optional dependency is missing; the message has the install line."""

    def __init__(self, package: str, extra: str, feature: str) -> None:
        super().__init__(
            f"{feature} needs the optional dependency {package!r}: pip install 'rbdata[{extra}]'"
        )


class DownloadError(OSError):
    """Raised when a dataset file cannot be fetched (missing, refused, or network failures).

    Raised by the offline datasets (:mod:`rbdata.datasets`, which exports it too).
    """


class ChecksumError(ValueError):
    """Raised when a downloaded or local file has the wrong size or SHA-256 digest.

    The message names the file (or URL), the expected and the actual value. A file that was
    already there (a local copy, a file in the cache) is never deleted for failing the check.
    """
