"""Per-frame compression of real Atari frames: which codec for a pixel buffer (issue 35).

For each game (Pong, Breakout, Seaquest; 20,000 steps of a seeded random policy, 84x84 gray
frames from ``tests/_atari_frames.py``, each distinct frame once, in episode order):

1. **Codecs, one frame at a time** (one thread): lz4 block (``store_size=False``; default mode,
   ``mode="fast"``, and high compression level 9), zstd levels 1 and 3 (``zstandard``), and
   keyframe + delta schemes: a keyframe every K frames of an episode (K = 8, 16, 32), the
   others stored as their XOR (or their byte-wise difference) with the previous frame of the
   same episode, compressed by zstd-1 or lz4. Per codec: compressed bytes per frame and ratio
   (to 7,056 raw bytes; payload only, a storage adds an offset per frame), the median time per
   frame to encode and to decode in order, and to decode one frame at random (a delta needs
   its keyframe and every delta up to it: (K - 1) / 2 extra decodes on average). Every decode
   is checked bit-exact. The floor row is a plain copy of the raw frame.
2. **Batched decode of 160 random frames** (a ``sample(32)`` of 4-stacks, observation and
   next observation, with no frame shared): (a) a Python loop of ``lz4.block.decompress``
   into a ``[160, 84, 84]`` batch, (b) the same split over 2 threads (``ThreadPoolExecutor``;
   lz4 and zstd release the GIL while they decode), (c) ``zstandard``'s
   ``multi_decompress_to_buffer(threads=2)`` then the copy into the batch; zstd-1 in a loop
   and in 2 threads too. Floor: ``np.take`` of the same 160 raw frames into the batch.

Without ``ale-py`` the frames are synthetic and every header says so.

Run: ``python tests/benchmarks/bench_codecs.py [--quick]`` (part of ``make bench``; about
2 minutes the first time, which records and caches the frames, 1 minute after; ``--quick``
records 2,000 steps per game).
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import torch
from _native_decode import NativeBatch
from _timing import QUICK, Config, Report, fmt_time, measure
from _timing import main as timing_main

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the frames
from _atari_frames import GAMES, SIZE, atari_steps

try:
    import lz4.block
    import zstandard
except ImportError:  # `pip install 'rbdata[bench]'`
    lz4 = zstandard = None

RAW = SIZE * SIZE  #: bytes of one frame
BATCH = 160  #: frames a sample(32) of 4-stacks (observation and next) decodes at most
KEYS = (8, 16, 32)  #: keyframe intervals of the delta schemes
CHUNK = 50  #: frames per timed chunk; a row is the median over chunks of the time per frame

Encode = Callable[[np.ndarray], bytes]
Decode = Callable[[bytes], bytes]


def codecs() -> dict[str, tuple[Encode, Decode]]:
    """The per-frame codecs: name -> (encode a frame, decode to its 7,056 bytes)."""

    def lz4_block(**kw: Any) -> tuple[Encode, Decode]:
        return (
            lambda f: lz4.block.compress(f, store_size=False, **kw),
            lambda c: lz4.block.decompress(c, uncompressed_size=RAW),
        )

    def zstd(level: int) -> tuple[Encode, Decode]:
        return zstandard.ZstdCompressor(
            level=level
        ).compress, zstandard.ZstdDecompressor().decompress

    return {
        "lz4": lz4_block(),
        "lz4 fast": lz4_block(mode="fast"),  # acceleration 1: the default's algorithm
        "lz4 hc-9": lz4_block(mode="high_compression", compression=9),
        "zstd-1": zstd(1),
        "zstd-3": zstd(3),
    }


def _xor(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.bitwise_xor(a, b)


def _sub(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.subtract(a, b)  # uint8: modulo 256


def _add(d: np.ndarray, prev: np.ndarray) -> np.ndarray:
    return np.add(d, prev)


DELTAS = {"xor": (_xor, _xor), "sub": (_sub, _add)}  #: name -> (make a delta, undo it)


def _median_per_frame(fn: Callable[[int], object], order: Sequence[int]) -> float:
    """Median over chunks of ``CHUNK`` calls ``fn(k)`` (in ``order``) of seconds per call."""
    times = []
    for s in range(0, len(order), CHUNK):
        part = order[s : s + CHUNK]
        t0 = time.perf_counter()
        for k in part:
            fn(k)
        times.append((time.perf_counter() - t0) / len(part))
    return statistics.median(times)


class Scheme:
    """One codec over a game's frames: the compressed frames and how to get one back."""

    def __init__(self, encode: Encode, decode: Decode, key: int = 1, delta: str = "xor") -> None:
        self.encode, self.decode, self.key = encode, decode, key
        self.make, self.undo = DELTAS[delta]
        self.blobs: list[bytes] = []

    def encode_all(self, frames: np.ndarray, pos: np.ndarray) -> float:
        """Compress every frame in order; the median seconds per frame."""
        blobs: list[bytes] = [b""] * len(frames)

        def one(k: int) -> None:
            f = frames[k]
            blobs[k] = self.encode(f if pos[k] % self.key == 0 else self.make(f, frames[k - 1]))

        t = _median_per_frame(one, range(len(frames)))
        self.blobs = blobs
        return t

    def _raw(self, k: int) -> np.ndarray:
        return np.frombuffer(self.decode(self.blobs[k]), np.uint8)

    def decode_in_order(self, frames: np.ndarray, pos: np.ndarray) -> float:
        """Decode every frame in order (a delta onto the frame before), checked; s per frame."""
        out = np.empty((len(frames), RAW), np.uint8)

        def one(k: int) -> None:
            got = self._raw(k)
            out[k] = got if pos[k] % self.key == 0 else self.undo(got, out[k - 1])

        t = _median_per_frame(one, range(len(frames)))
        if not np.array_equal(out, frames.reshape(len(frames), RAW)):
            raise AssertionError("a decoded frame differs from the original")
        return t

    def frame(self, k: int, pos: np.ndarray) -> np.ndarray:
        """Frame ``k`` on its own: its keyframe, then each delta up to it."""
        first = k - pos[k] % self.key
        out = self._raw(first)
        for j in range(first + 1, k + 1):
            out = self.undo(self._raw(j), out)
        return out

    def random_access(self, frames: np.ndarray, pos: np.ndarray, picks: np.ndarray) -> float:
        """Decode the frames ``picks`` one by one into a row (as in order); s per frame."""
        for k in picks[:20]:
            if not np.array_equal(self.frame(int(k), pos), frames[k].reshape(-1)):
                raise AssertionError(f"frame {k} decoded at random differs")
        row = np.empty(RAW, np.uint8)
        return _median_per_frame(
            lambda k: np.copyto(row, self.frame(k, pos)), [int(k) for k in picks]
        )


def _positions(frame_episode: np.ndarray) -> np.ndarray:
    """Each frame's position within its episode."""
    starts = np.r_[0, np.flatnonzero(np.diff(frame_episode)) + 1]
    return np.arange(len(frame_episode)) - np.repeat(
        starts, np.diff(np.r_[starts, len(frame_episode)])
    )


def _schemes() -> dict[str, Scheme]:
    base = codecs()
    out = {name: Scheme(*pair) for name, pair in base.items()}
    for key in KEYS:
        for inner in ("zstd-1", "lz4"):
            for delta in DELTAS:
                out[f"{delta} K={key} {inner}"] = Scheme(*base[inner], key=key, delta=delta)
    return out


#: game -> codec -> (bytes per frame, ratio, encode, decode in order, decode at random)
TABLE: dict[str, dict[str, tuple[float, float, float, float, float]]] = {}


def _steps(cfg: Config, game: str) -> Any:
    steps = atari_steps(game, 2_000 if cfg is QUICK else 20_000)
    print(f"  frames: {steps.describe()}")
    return steps


def per_frame(cfg: Config, rep: Report) -> None:
    """Workload 1: every codec on every game, one frame at a time."""
    for game in GAMES:
        print(f"\n1. {game}: codecs one frame at a time (median us per frame)")
        _per_frame_game(game, _steps(cfg, game), 500 if cfg is QUICK else 2_000)


def _per_frame_game(game: str, steps: Any, n_picks: int) -> None:
    frames, pos = steps.frames, _positions(steps.frame_episode)
    picks = np.random.default_rng(0).integers(0, len(frames), n_picks)
    flat = frames.reshape(len(frames), RAW)
    row = np.empty(RAW, np.uint8)
    copy_enc = _median_per_frame(lambda k: flat[k].tobytes(), range(len(frames)))
    copy_dec = _median_per_frame(lambda k: np.copyto(row, flat[k]), range(len(frames)))
    print(
        f"  {'codec':<22} {'B/frame':>8} {'ratio':>7} {'encode':>11} {'decode':>11} "
        f"{'random':>11} {'dec/floor':>9}"
    )
    print(
        f"  {'floor: raw copy':<22} {RAW:>8} {1.0:>6.1f}x {fmt_time(copy_enc)} "
        f"{fmt_time(copy_dec)} {fmt_time(copy_dec)} {1.0:>8.1f}x"
    )
    TABLE[game] = {}
    for name, scheme in _schemes().items():
        enc = scheme.encode_all(frames, pos)
        dec = scheme.decode_in_order(frames, pos)
        rand = scheme.random_access(frames, pos, picks)
        size = sum(map(len, scheme.blobs)) / len(frames)
        TABLE[game][name] = (size, RAW / size, enc, dec, rand)
        print(
            f"  {name:<22} {size:>8.0f} {RAW / size:>6.1f}x {fmt_time(enc)} "
            f"{fmt_time(dec)} {fmt_time(rand)} {dec / copy_dec:>8.1f}x"
        )


class Batches:
    """Decode ``BATCH`` frames at fresh random indices into one ``[BATCH, 84 * 84]`` batch."""

    def __init__(self, frames: np.ndarray, pool: ThreadPoolExecutor, n_sets: int) -> None:
        self.frames, self.pool = frames, pool
        base = codecs()
        self.blobs = {name: [base[name][0](f) for f in frames] for name in ("lz4", "zstd-1")}
        rng = np.random.default_rng(1)
        self.sets = [rng.integers(0, len(frames), BATCH) for _ in range(n_sets)]
        self.out = np.empty((BATCH, RAW), np.uint8)
        self.turn = 0
        # a ZstdDecompressor is not thread-safe: one per thread (lz4.block keeps no state)
        self.zstd = [zstandard.ZstdDecompressor() for _ in range(2)]
        self.sizes = np.full(BATCH, RAW, np.uint64)
        self.frames_t, self.out_t = torch.from_numpy(frames), torch.from_numpy(self.out)
        self.native: dict[str, NativeBatch] = {}
        for codec, name in (("lz4", "lz4"), ("zstd", "zstd-1")):
            try:
                self.native[codec] = NativeBatch(codec, self.blobs[name])
            except RuntimeError as err:
                print(f"  {err}: no (d) row for it")

    def indices(self) -> list[int]:
        self.turn = (self.turn + 1) % len(self.sets)
        return self.sets[self.turn].tolist()

    def _decoder(self, name: str, thread: int) -> Decode:
        if name == "lz4":
            return lambda c: lz4.block.decompress(c, uncompressed_size=RAW)
        return self.zstd[thread].decompress

    def _into(self, name: str, idx: list[int], at: int, thread: int) -> None:
        dec, got, out = self._decoder(name, thread), self.blobs[name], self.out
        for i, j in enumerate(idx, at):
            out[i] = np.frombuffer(dec(got[j]), np.uint8)

    def floor(self) -> None:
        idx = torch.from_numpy(self.sets[(self.turn + 1) % len(self.sets)])
        self.indices()
        torch.index_select(self.frames_t, 0, idx, out=self.out_t)

    def in_native(self, codec: str, threads: int) -> None:
        self.indices()
        self.native[codec].decode(self.sets[self.turn], self.out, threads)

    def loop(self, name: str) -> None:
        self._into(name, self.indices(), 0, 0)

    def threads(self, name: str) -> None:
        idx = self.indices()
        half = len(idx) // 2
        other = self.pool.submit(self._into, name, idx[half:], half, 1)
        self._into(name, idx[:half], 0, 0)
        other.result()

    def multi(self, threads: int) -> None:
        got = self.blobs["zstd-1"]
        res = self.zstd[0].multi_decompress_to_buffer(
            [got[j] for j in self.indices()], decompressed_sizes=self.sizes, threads=threads
        )
        for i in range(BATCH):
            self.out[i] = np.frombuffer(res[i], np.uint8)

    def check(self) -> None:
        """Every variant fills the batch with the frames at the indices it drew."""
        fns = [lambda: self.loop("lz4"), lambda: self.threads("zstd-1"), lambda: self.multi(2)]
        fns += [lambda c=c: self.in_native(c, 2) for c in self.native]
        for fn in fns:
            self.out[:] = 0
            fn()
            if not np.array_equal(self.out, self.frames[self.sets[self.turn]]):
                raise AssertionError("a batched decode differs from the frames")


def batched(cfg: Config, rep: Report) -> None:
    """Workload 2: decode 160 random frames into one batch, per library and threading."""
    with ThreadPoolExecutor(2) as pool:
        for game in GAMES:
            print(f"\n2. {game}: decode {BATCH} random frames into a [{BATCH}, 84, 84] batch")
            steps = _steps(cfg, game)
            b = Batches(steps.frames.reshape(-1, RAW), pool, 8 if cfg is QUICK else 64)
            b.check()
            python = {
                "floor": b.floor,
                "(a) lz4 loop": lambda b=b: b.loop("lz4"),
                "(b) lz4, 2 threads": lambda b=b: b.threads("lz4"),
                "zstd-1 loop": lambda b=b: b.loop("zstd-1"),
                "zstd-1, 2 threads": lambda b=b: b.threads("zstd-1"),
                "(c) zstd-1 multi_decompress, threads=2": lambda b=b: b.multi(2),
                "zstd-1 multi_decompress, threads=1": lambda b=b: b.multi(1),
            }
            native = {
                f"(d) {c} numba kernel, {n} thread{'s' * (n > 1)}": (
                    lambda b=b, c=c, n=n: b.in_native(c, n)
                )
                for c in b.native
                for n in (1, 2)
            }
            # apart: numba's OpenMP threads spin a while after each kernel, taking the core
            # the Python threads of (b) and (c) would use
            t = measure(python, cfg)
            floor = t.pop("floor")
            print(f"  floor: index_select of {BATCH} raw frames into the batch: {fmt_time(floor)}")
            Report.columns()
            for label, seconds in t.items():
                rep.info(f"{label} ({seconds / BATCH * 1e6:.2f} us/frame)", seconds, floor)
            if native:
                t = measure({"floor": b.floor, **native}, cfg)
                floor = t.pop("floor")
                rep.note(f"the native kernels, against the floor timed again: {fmt_time(floor)}")
                for label, seconds in t.items():
                    rep.info(f"{label} ({seconds / BATCH * 1e6:.2f} us/frame)", seconds, floor)


def summary_table(cfg: Config, rep: Report) -> None:
    """The ratios of every codec on every game, side by side (docs/pixels.md's table)."""
    if not TABLE:
        return
    games = list(TABLE)
    print("\nsummary: compression ratio (raw 7,056 B / compressed B) and decode us per frame")
    print(f"  {'codec':<22} " + " ".join(f"{g:>22}" for g in games))
    for name in TABLE[games[0]]:
        cells = []
        for g in games:
            _, ratio, _, dec, rand = TABLE[g][name]
            cells.append(f"{ratio:6.1f}x {dec * 1e6:5.1f}/{rand * 1e6:5.1f} us")
        print(f"  {name:<22} " + " ".join(f"{c:>22}" for c in cells))
    print("  (decode in order / one frame at random)")


def main(argv: list[str] | None = None) -> int:
    """Run every workload; ``--quick`` for a smoke run on 2,000 steps per game."""
    if lz4 is None or zstandard is None:
        print("lz4 and zstandard are needed: pip install 'rbdata[bench]'")
        return 0
    return timing_main(
        "bench_codecs: per-frame codecs on Atari frames (84x84 gray), one thread",
        [per_frame, batched, summary_table],
        argv,
        quick_help="2,000 steps per game, fewer repeats",
    )


if __name__ == "__main__":
    sys.exit(main())
