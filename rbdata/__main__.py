"""``python -m rbdata``: the same as the ``rbdata`` command (see :mod:`rbdata.cli`)."""

from rbdata.cli import main

__all__: list[str] = []

if __name__ == "__main__":
    raise SystemExit(main())
