"""The ``rbdata`` command line (also ``python -m rbdata``).

``rbdata demo`` downloads, converts and trains on a D4RL-layout sample; ``rbdata datasets
list|download|info|path|remove|sample`` manages the offline dataset cache (the logic is in
:mod:`rbdata.datasets`, one function per action); ``rbdata inspect PATH`` summarises a
storage directory or checkpoint on disk without reading its data (the logic is in
:mod:`rbdata.inspect`).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Sequence
from typing import Any

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
        >>> args = build_parser().parse_args(["datasets", "info", "d4rl/hopper-medium-v2"])
        >>> args.command, args.action, args.id, args.backend
        ('datasets', 'info', 'd4rl/hopper-medium-v2', None)
        >>> args = build_parser().parse_args(["inspect", "/data/buffer", "--json"])
        >>> args.command, args.path, args.json
        ('inspect', '/data/buffer', True)
    """
    parser = argparse.ArgumentParser(
        prog="rbdata",
        description="Replay buffers and offline RL datasets as PyTorch datasets.",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    demo = commands.add_parser(
        "demo",
        help="download a D4RL-layout sample from a local mirror, convert it and train on it",
        description=(
            "Build the cartpole-random-v0 D4RL-layout sample, serve it on 127.0.0.1, download "
            "and convert it with rbdata.datasets.D4RL into a temporary cache, reopen it, and fit "
            "a small Q-network by TD learning through a DataLoader; print the download, "
            "convert and reopen times, batches/s and the loss."
        ),
    )
    demo.add_argument(
        "--batch-size", type=_positive_int, default=256, help="items per batch (default: 256)"
    )
    demo.add_argument(
        "--workers",
        type=_non_negative_int,
        default=0,
        help=(
            "DataLoader worker processes (default: 0, load in the main process: for small "
            "transitions on few cores one batched read beats worker processes)"
        ),
    )
    demo.add_argument(
        "--steps", type=_positive_int, default=400, help="gradient steps (default: 400)"
    )
    _add_datasets_parser(commands)
    _add_inspect_parser(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``rbdata`` command with ``argv`` (default: ``sys.argv[1:]``); return the exit code.

    Bad arguments exit with status 2 and a usage message, as ``argparse`` does; a failed
    ``datasets`` or ``inspect`` command prints one line ``rbdata: error: ...`` to stderr and
    returns 1.
    """
    args = build_parser().parse_args(argv)
    if args.command == "demo":
        from rbdata.demo import run_demo

        run_demo(batch_size=args.batch_size, num_workers=args.workers, steps=args.steps)
        return 0
    if args.command == "datasets":
        return _run_datasets(args)
    if args.command == "inspect":
        return _run_inspect(args)
    raise AssertionError(f"unhandled command {args.command!r}")  # argparse rejects others


# --- rbdata inspect PATH -----------------------------------------------------------------------
def _add_inspect_parser(commands: Any) -> None:
    inspect = commands.add_parser(
        "inspect",
        help="show what a storage directory or checkpoint on disk holds, without loading it",
        description=(
            "Summarise a MemmapStorage or ArrowStorage directory, a checkpoint written by "
            "ReplayBuffer.dumps, or a converted D4RL/Minari cache entry: capacity, length, next "
            "slot, keys with shapes and dtypes, size on disk, and for a checkpoint the sampler's "
            "and writer's class, config and state. Only metadata is read (never the data "
            "files); nothing is written and no symlink is followed. Exit 1 with one line on "
            "stderr if PATH is none of these or its metadata is corrupt."
        ),
    )
    inspect.add_argument("path", metavar="PATH", help="the directory to inspect")
    inspect.add_argument(
        "--json", action="store_true", help="print the summary as one JSON object (for scripts)"
    )


def _run_inspect(args: argparse.Namespace) -> int:
    import json

    from rbdata.inspect import format_summary, inspect_path

    try:
        summary = inspect_path(args.path)
        if args.json:
            print(json.dumps(summary.to_json(), indent=1))
        else:
            print(format_summary(summary))
    except BrokenPipeError:  # `rbdata inspect PATH | head`: the reader left, stop quietly
        with contextlib.suppress(OSError, ValueError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except (ValueError, OSError) as err:  # CheckpointError is a ValueError
        text = str(err) or type(err).__name__
        print(f"rbdata: error: {' '.join(text.split())}", file=sys.stderr)
        return 1
    return 0


# --- rbdata datasets ... ----------------------------------------------------------------------
_ID_HELP = (
    "d4rl/<name> (or a bare D4RL name, e.g. hopper-medium-v2), minari/<dataset_id> "
    "(e.g. minari/mujoco/hopper/medium-v0), ogbench/<name> (e.g. "
    "ogbench/antmaze-large-navigate-v0; its validation split: ogbench/<name>-val) or "
    "atari-dqn/<Game>/<run>[/<checkpoints>] (the DQN Replay Dataset, e.g. atari-dqn/Pong/1 "
    "for checkpoint 50, atari-dqn/Pong/1/40-50)"
)
_BACKEND_HELP = "storage backend (default: memmap, else the one backend the ID is converted to)"


def _backend_option(parser: Any, help: str, default: str | None = None) -> None:
    # one action per parser: a shared parent's action would share its default too
    # rbdata.datasets._cache.BACKENDS (not imported here: the CLI starts without torch)
    backends = ("memmap", "arrow", "frames")
    parser.add_argument("--backend", choices=backends, default=default, help=help)


def _add_datasets_parser(commands: Any) -> None:
    datasets = commands.add_parser(
        "datasets",
        help="list, download, inspect and remove offline datasets (D4RL, Minari, OGBench, "
        "DQN Replay)",
        description=(
            "Manage the offline dataset cache (--root, else $RBDATA_HOME, else the user cache "
            "directory). An ID is d4rl/<name>, minari/<dataset_id>, ogbench/<name> or "
            "atari-dqn/<Game>/<run>; the prefixes are lower case, so minari/D4RL/door/human-v2 "
            "is Minari's D4RL namespace."
        ),
    )
    actions = datasets.add_subparsers(dest="action", metavar="ACTION", required=True)
    root = argparse.ArgumentParser(add_help=False)
    root.add_argument(
        "--root", metavar="DIR", help="cache root (default: $RBDATA_HOME, else the user cache)"
    )
    ident = argparse.ArgumentParser(add_help=False)
    ident.add_argument("id", metavar="ID", help=_ID_HELP)

    listing = actions.add_parser(
        "list",
        parents=[root],
        help="list D4RL, Minari, OGBench and DQN Replay datasets and what is in the cache",
        description=(
            "List every D4RL, OGBench and DQN Replay id of the catalogs and the Minari "
            "datasets that are local ($MINARI_DATASETS_PATH) or converted, with their size, "
            "whether the data file is here and the backends (DQN Replay: the checkpoints) "
            "converted in the cache."
        ),
    )
    listing.add_argument(
        "--family", choices=("d4rl", "minari", "ogbench", "atari-dqn"), help="one family only"
    )
    listing.add_argument(
        "--downloaded", action="store_true", help="only datasets with something in the cache"
    )
    listing.add_argument(
        "--remote", action="store_true", help="also list Minari's remote datasets (network)"
    )

    download = actions.add_parser(
        "download",
        parents=[ident, root],
        help="download (or take a local file) and convert a dataset; print its path",
        description=(
            "Download (resumable, checksummed) and convert a dataset into the cache. With "
            "--file (or a file:// --url), a local copy of the D4RL file, e.g. D4RL's own "
            "~/.d4rl/datasets/*.hdf5, is verified like a download and converted without the "
            "network; it is never modified or deleted."
        ),
    )
    _backend_option(download, "storage backend (default: memmap; frames for atari-dqn ids)")
    source = download.add_mutually_exclusive_group()
    source.add_argument(
        "--url", help="D4RL only: download this URL (or file:// path) instead of the catalog's"
    )
    source.add_argument(
        "--file",
        metavar="PATH",
        help="D4RL and OGBench: convert this local copy of the file (HDF5, .npz); atari-dqn: "
        "a folder of Dopamine's files (<name>_ckpt.<N>.gz, or in its replay_logs/)",
    )
    download.add_argument(
        "--sha256",
        metavar="HEX",
        help="D4RL and OGBench: the expected digest instead of the catalog's",
    )

    info = actions.add_parser(
        "info",
        parents=[ident, root],
        help="show a converted dataset's counts, keys, source and metadata",
        description="Show what dataset.json of a converted entry records (exit 1 if none).",
    )
    _backend_option(info, _BACKEND_HELP)
    path = actions.add_parser(
        "path",
        parents=[root],
        help="print a dataset's directory in the cache (or the cache root)",
        description=(
            "Print the entry's directory; exit 0 if it is converted, else 1 (the path is still "
            "printed, a note goes to stderr). Without ID, print the cache root."
        ),
    )
    path.add_argument("id", metavar="ID", nargs="?", help=_ID_HELP)
    _backend_option(path, _BACKEND_HELP)

    remove = actions.add_parser(
        "remove",
        parents=[ident, root],
        help="remove a dataset's converted entries and downloaded file from the cache",
        description=(
            "Remove the converted entry (or every backend's) and, for D4RL, the downloaded "
            "HDF5 file, which ids sharing the file share. Minari's own copy "
            "($MINARI_DATASETS_PATH) is left alone. Exit 1 if nothing was there."
        ),
    )
    which = remove.add_mutually_exclusive_group()
    _backend_option(which, "the backend to remove (default: memmap, else the one converted)")
    which.add_argument("--all-backends", action="store_true", help="remove every backend")
    remove.add_argument(
        "--keep-download", action="store_true", help="keep the downloaded D4RL file"
    )

    sample = actions.add_parser(
        "sample",
        parents=[ident],
        help="write the file of an rbdata sample dataset (e.g. d4rl/cartpole-random-v0)",
        description=(
            "Build the D4RL-layout HDF5 file of an rbdata sample dataset (not on the D4RL host) "
            "with the recipe shipped in the package, and print its path, size and sha256 and "
            "the command that converts it (rbdata datasets download ID --file PATH)."
        ),
    )
    sample.add_argument("--out", metavar="FILE", help="the file to write (default: ./<name>.hdf5)")


def _run_datasets(args: argparse.Namespace) -> int:
    from rbdata import datasets as commands

    try:
        root = commands.cache_root(getattr(args, "root", None))
        if args.action == "list":
            return commands.list_command(
                root, family=args.family, downloaded=args.downloaded, remote=args.remote
            )
        if args.action == "path":
            ref = None if args.id is None else commands.parse_id(args.id)
            return commands.path_command(root, ref, backend=args.backend)
        ref = commands.parse_id(args.id)
        if args.action == "download":
            backend = args.backend or commands.family_backend(ref.family)
            return commands.download_command(
                root, ref, backend=backend, url=args.url, sha256=args.sha256, file=args.file
            )
        if args.action == "info":
            return commands.info_command(root, ref, backend=args.backend)
        if args.action == "sample":
            return commands.sample_command(ref, args.out)
        if args.action == "remove":
            return commands.remove_command(
                root,
                ref,
                backend=args.backend,
                all_backends=args.all_backends,
                keep_download=args.keep_download,
            )
    except KeyboardInterrupt:
        print("rbdata: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `rbdata datasets list | head`: the reader left, stop quietly
        with contextlib.suppress(OSError, ValueError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except (KeyError, ValueError, OSError, ImportError) as err:
        print(f"rbdata: error: {commands.error_line(err)}", file=sys.stderr)
        return 1
    raise AssertionError(f"unhandled action {args.action!r}")  # argparse rejects others
