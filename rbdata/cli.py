"""The ``rbdata`` command line: ``rbdata demo`` (also ``python -m rbdata demo``)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

__all__ = ["build_parser", "main"]


def _positive_int(text: str) -> int:
    value = _non_negative_int(text)
    if value == 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``rbdata`` command.

    Examples:
        >>> args = build_parser().parse_args(["demo", "--batch-size", "64", "--workers", "0"])
        >>> args.command, args.batch_size, args.workers
        ('demo', 64, 0)
    """
    parser = argparse.ArgumentParser(
        prog="rbdata",
        description="Replay buffers and offline RL datasets as PyTorch datasets.",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    demo = commands.add_parser(
        "demo",
        help="load the bundled CartPole sample into a buffer and time two read paths",
        description=(
            "Load the bundled cartpole-random-v0 sample into a memory-mapped replay buffer and "
            "read one epoch through a DataLoader over the storage and one by iterating the "
            "buffer; print items, bytes per item, batches/s and MB/s."
        ),
    )
    demo.add_argument(
        "--batch-size", type=_positive_int, default=256, help="items per batch (default: 256)"
    )
    demo.add_argument(
        "--workers",
        type=_non_negative_int,
        default=2,
        help="DataLoader worker processes; 0 loads in the main process (default: 2)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``rbdata`` command with ``argv`` (default: ``sys.argv[1:]``); return the exit code.

    Bad arguments exit with status 2 and a usage message, as ``argparse`` does.
    """
    args = build_parser().parse_args(argv)
    if args.command == "demo":
        from rbdata.demo import run_demo

        run_demo(batch_size=args.batch_size, num_workers=args.workers)
        return 0
    raise AssertionError(f"unhandled command {args.command!r}")  # argparse rejects others
