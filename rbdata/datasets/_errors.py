"""The errors of dataset downloads and file checks (exported by :mod:`rbdata.datasets`)."""

from __future__ import annotations

__all__ = ["ChecksumError", "DownloadError"]


class DownloadError(OSError):
    """Raised when a dataset file cannot be fetched (missing, refused, or network failures)."""


class ChecksumError(ValueError):
    """Raised when a downloaded or local file has the wrong size or SHA-256 digest.

    The message names the file (or URL), the expected and the actual value. A file that was
    already there (a local copy, a file in the cache) is never deleted for failing the check.
    """
