"""Sampler benchmarks: prioritized and slice sampling against plain-tensor floors and cpprb.

Each workload is timed for rbdata, for its *floor* (the same draw done directly on plain
tensors with no buffer, tree or episode index around it) and, where one exists, for cpprb,
all interleaved in the same run; ratios are rbdata / floor and rbdata / cpprb. The script
reports and exits 0 whether targets pass or fail; it exits 1 only if a workload raised.

Usage::

    .venv/bin/python tests/benchmarks/bench_samplers.py           # full run (under a minute)
    .venv/bin/python tests/benchmarks/bench_samplers.py --quick   # smoke run, no 10M buffer
"""

from __future__ import annotations

import itertools
import sys
from collections.abc import Callable
from typing import Any

import _timing
import numpy as np
import torch
from _timing import Config, Report, free, measure
from bench_foundation import leaves, transitions
from tensordict import TensorDict

from rbdata import (
    PrioritizedSampler,
    PrioritizedSliceSampler,
    ReplayBuffer,
    SequenceSampler,
    SliceSampler,
    TensorStorage,
)

try:
    import cpprb
except ImportError:  # optional peer: `pip install 'rbdata[bench]'`
    cpprb = None

TORCHRL_PER_NOTE = (
    "TorchRL PrioritizedSampler.sample: ~100 us per DESIGN.md (not installed); "
    "target <= 0.6x of it = 60 us"
)
QUICK_SIZES = (100_000, 1_000_000)
FULL_SIZES = (100_000, 1_000_000, 10_000_000)


def _size(n: int) -> str:
    return f"{n // 1_000_000}M" if n >= 1_000_000 else f"{n // 1000}k"


# --- 1. prioritized ---------------------------------------------------------------------------
def _cpprb_per(n: int, alpha: float) -> Any:
    env = {
        "obs": {"shape": 17},
        "act": {"shape": 6},
        "rew": {},
        "next_obs": {"shape": 17},
        "done": {"dtype": np.bool_},
    }
    return cpprb.PrioritizedReplayBuffer(n, env, alpha=alpha)


def bench_prioritized(cfg: Config, rep: Report) -> None:
    n, bs, alpha, beta, pool_size = 1_000_000, 256, 0.6, 0.4, 1000
    rep.section(
        f"1. PrioritizedSampler, N=1M filled, batch {bs}, alpha={alpha}, beta={beta}, "
        "random priorities; updates with fresh random batches (a pool of "
        f"{pool_size} cycled)",
        f"v = (p + eps)**alpha, cdf = cumsum(v) and v.min() computed once outside the timing; "
        f"per call searchsorted(cdf, rand({bs}) * cdf[-1]) + weights (v[idx] / v_min)**-beta "
        "(sample: + index_select on the 5 plain tensors; update: v.index_put_ of the new "
        "values, no tree)",
    )
    g = torch.Generator().manual_seed(0)
    priority = torch.rand(n, generator=g, dtype=torch.float64)
    pool = [
        (torch.randint(n, (bs,), generator=g), torch.rand(bs, generator=g))
        for _ in range(pool_size)
    ]
    np_pool = [(i.numpy(), p.numpy()) for i, p in pool]

    # rbdata: small items for draw/update, transitions for the full sample (data gather)
    sampler = PrioritizedSampler(n, alpha, beta)
    small = ReplayBuffer(TensorStorage(n), sampler=sampler)
    small.extend({"observation": torch.randn(n, 4)})
    small.update_priority(torch.arange(n), priority)
    data = transitions(n)
    plain = leaves(data)
    full = ReplayBuffer(TensorStorage(n), sampler=PrioritizedSampler(n, alpha, beta))
    full.extend(data)
    full.update_priority(torch.arange(n), priority)
    eps = sampler.eps

    # floor: searchsorted on a cached CDF
    values = (priority + eps).pow(alpha)
    cdf = torch.cumsum(values, 0)
    total = cdf[-1]
    v_min = values.min()
    gf = torch.Generator().manual_seed(1)

    def floor_draw() -> tuple[torch.Tensor, torch.Tensor]:
        u = torch.rand(bs, generator=gf, dtype=torch.float64).mul_(total)
        idx = torch.searchsorted(cdf, u, right=True)
        weight = (values.index_select(0, idx) / v_min).pow_(-beta).to(torch.float32)
        return idx, weight

    def floor_sample() -> list[torch.Tensor]:
        idx, weight = floor_draw()
        return [t.index_select(0, idx) for t in plain] + [weight]

    crb = None
    if cpprb is not None:
        crb = _cpprb_per(n, alpha)
        obs, act, rew, done, next_obs = (x.numpy() for x in plain)
        crb.add(obs=obs, act=act, rew=rew, next_obs=next_obs, done=done)
        crb.update_priorities(np.arange(n), priority.numpy())
    del data  # the buffers and cpprb hold copies

    fns: dict[str, Callable[[], object]] = {
        "draw": lambda: sampler.draw(bs),
        "floor_draw": floor_draw,
        "sample": lambda: full.sample(bs),
        "floor_sample": floor_sample,
    }
    if crb is not None:
        fns["cpprb_sample"] = lambda: crb.sample(bs, beta=beta)
    t = measure(fns, cfg)

    cycle = itertools.cycle(pool)
    np_cycle = itertools.cycle(np_pool)
    flat = values.clone()

    def rb_update() -> None:
        small.update_priority(*next(cycle))

    def floor_update() -> None:
        idx, p = next(cycle)
        flat.index_put_((idx,), (p.to(torch.float64) + eps).pow_(alpha))

    # a pool of 256 batches: the touched nodes stay in cache, per-call overhead shows
    small_cycle = itertools.cycle(pool[:256])
    small_np_cycle = itertools.cycle(np_pool[:256])

    ufns: dict[str, Callable[[], object]] = {
        "update": rb_update,
        "floor_update": floor_update,
        "update_256": lambda: small.update_priority(*next(small_cycle)),
    }
    if crb is not None:
        ufns["cpprb_update"] = lambda: crb.update_priorities(*next(np_cycle))
        ufns["cpprb_update_256"] = lambda: crb.update_priorities(*next(small_np_cycle))
    t.update(measure(ufns, cfg))

    rep.absolute(
        f"sampler.draw({bs}) (indices + weights)", t["draw"], t["floor_draw"], target_us=60.0
    )
    rep.info(f"rb.sample({bs}), transitions (draw + gather)", t["sample"], t["floor_sample"])
    if "cpprb_sample" in t:
        rep.peer(f"cpprb PER.sample({bs}, beta={beta})", t["cpprb_sample"], t["floor_sample"])
    rep.info(f"rb.update_priority({bs} fresh random idx)", t["update"], t["floor_update"])
    if "cpprb_update" in t:
        rep.peer(f"cpprb PER.update_priorities({bs})", t["cpprb_update"], t["floor_update"])
    if crb is None:
        rep.note("cpprb not installed: peer lines skipped (pip install 'rbdata[bench]')")
    else:
        rep.columns("cpprb")
        rep.ratio(
            f"rb.sample({bs}) vs cpprb sample (both gather)",
            t["sample"],
            t["cpprb_sample"],
            1.0,
            strict=True,
        )
        rep.ratio(
            f"update_priority({bs}) vs cpprb update_priorities",
            t["update"],
            t["cpprb_update"],
            1.0,
        )
        rep.ratio(
            "  the same, a pool of 256 batches (in cache)",
            t["update_256"],
            t["cpprb_update_256"],
            1.0,
        )
        rep.info(  # what a PER training step pays: one sample and one priority update
            f"PER step: sample({bs}) + update_priority({bs})",
            t["sample"] + t["update"],
            t["cpprb_sample"] + t["cpprb_update"],
        )
    rep.note(TORCHRL_PER_NOTE)


# --- 2. slices --------------------------------------------------------------------------------
def _episodes(n: int, ep_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Observations (n, 4) and done flags (n, 1), one episode end every ``ep_len`` steps."""
    obs = torch.randn(n, 4)
    done = torch.zeros(n, 1, dtype=torch.bool)
    done[ep_len - 1 :: ep_len] = True
    return obs, done


def _td(obs: torch.Tensor, done: torch.Tensor) -> TensorDict:
    return TensorDict({"observation": obs, "next": {"done": done}}, batch_size=[obs.shape[0]])


EP_LEN, SLICE_LEN, SLICE_BATCH = 1000, 8, 256
FILL_CHUNK, EXT = 500_000, 1000  # rows per extend when filling; rows per write in the cycle


def _slices_at(n: int, cfg: Config, rep: Report) -> float:
    """Time slice sampling from a full buffer of ``n`` steps; return the rbdata / floor ratio."""
    ep_len, slice_len, bs, chunk, ext = EP_LEN, SLICE_LEN, SLICE_BATCH, FILL_CHUNK, EXT
    num_slices = bs // slice_len
    obs, done = _episodes(n, ep_len)
    rb = ReplayBuffer(TensorStorage(n), sampler=SliceSampler(slice_len=slice_len))
    for start in range(0, n, chunk):
        rb.extend(_td(obs[start : start + chunk], done[start : start + chunk]))
    episodes = n // ep_len
    arange = torch.arange(slice_len)
    g = torch.Generator().manual_seed(0)

    def floor() -> tuple[torch.Tensor, torch.Tensor]:
        ep = torch.randint(episodes, (num_slices,), generator=g)
        off = torch.randint(ep_len - slice_len + 1, (num_slices,), generator=g)
        idx = ((ep * ep_len + off).unsqueeze(1) + arange).reshape(-1)
        return obs.index_select(0, idx), done.index_select(0, idx)

    t = measure({"rbdata": lambda: rb.sample(bs), "floor": floor}, cfg)
    ratio = t["rbdata"] / t["floor"]
    rep.ratio(f"N={_size(n)} ({episodes} episodes)", t["rbdata"], t["floor"], 2.0)
    if n < 1_000_000:
        return ratio

    # one write + one sample: the sampler rebuilds its per-episode counts lazily
    new_obs, new_done = _episodes(ext, ep_len)
    episode = _td(new_obs, new_done)
    cursor = 0

    def cycle() -> Any:
        rb.extend(episode)
        return rb.sample(bs)

    def floor_cycle() -> Any:
        nonlocal cursor
        obs[cursor : cursor + ext] = new_obs
        done[cursor : cursor + ext] = new_done
        cursor = (cursor + ext) % n
        return floor()

    t = measure({"rbdata": cycle, "floor": floor_cycle}, cfg)
    rep.info(f"  N={_size(n)}: extend({ext}) + sample({bs}) cycle", t["rbdata"], t["floor"])
    return ratio


def bench_slices(cfg: Config, rep: Report) -> None:
    ep_len, slice_len, bs, ext = EP_LEN, SLICE_LEN, SLICE_BATCH, EXT
    sizes = QUICK_SIZES if cfg is _timing.QUICK else FULL_SIZES
    rep.section(
        f"2. SliceSampler(slice_len={slice_len}): rb.sample({bs}) = {bs // slice_len} slices x "
        f"{slice_len} steps; observation 4 floats + ('next', 'done'); {ep_len}-step episodes",
        f"randint(#episodes) + randint({ep_len} - {slice_len} + 1) offset + arange"
        f"({slice_len}) + index_select on the 2 plain tensors; cycle: + slice copy of "
        f"{ext} rows at a wrapping cursor",
    )
    ratios: dict[int, float] = {}
    for n in sizes:
        ratios[n] = _slices_at(n, cfg, rep)  # the buffer is freed on return
        free()
    small, large = min(ratios), max(ratios)
    rep.value(
        f"ratio at N={_size(large)} / ratio at N={_size(small)}",
        ratios[large] / ratios[small],
        1.25,
        text=f"{ratios[large]:.2f}x / {ratios[small]:.2f}x",
    )
    if large != FULL_SIZES[-1]:
        rep.note(f"N={_size(FULL_SIZES[-1])} skipped in --quick")


# --- 3. prioritized slices -------------------------------------------------------------------
def _prioritized_slices_at(n: int, cfg: Config, rep: Report) -> tuple[float, float]:
    """Time a prioritized slice draw from a full buffer of ``n`` steps: (seconds, floor)."""
    ep_len, slice_len, bs, chunk = EP_LEN, SLICE_LEN, SLICE_BATCH, FILL_CHUNK
    num_slices = bs // slice_len
    obs, done = _episodes(n, ep_len)
    gen = torch.Generator().manual_seed(0)
    sampler = PrioritizedSliceSampler(n, 0.6, 0.4, slice_len=slice_len, generator=gen)
    rb = ReplayBuffer(TensorStorage(n), sampler=sampler)
    for start in range(0, n, chunk):
        rb.extend(_td(obs[start : start + chunk], done[start : start + chunk]))
    # distinct priorities: every item its own (per-item updates, 64k items at a time)
    for items in torch.arange(n).split(65_536):
        rb.update_priority(items, torch.rand(items.shape[0], generator=gen, dtype=torch.float64))
    episodes = n // ep_len
    arange = torch.arange(slice_len)
    g = torch.Generator().manual_seed(1)

    def floor() -> torch.Tensor:  # a uniform slice draw on plain tensors: no tree, no index
        ep = torch.randint(episodes, (num_slices,), generator=g)
        off = torch.randint(ep_len - slice_len + 1, (num_slices,), generator=g)
        return ((ep * ep_len + off).unsqueeze(1) + arange).reshape(-1)

    t = measure({"rbdata": lambda: sampler.draw(bs), "floor": floor}, cfg)
    rep.ratio(f"N={_size(n)}: draw({bs}) + weights", t["rbdata"], t["floor"], 10.0)
    batch = rb.sample(bs)
    index, td_error = batch["index"], torch.rand(bs, dtype=torch.float64)
    u = measure({"rbdata": lambda: rb.update_priority(index, td_error), "floor": floor}, cfg)
    rep.info(f"  N={_size(n)}: update_priority({bs} items)", u["rbdata"], u["floor"])
    # slice_priority="max": each item re-derives the slice_len starts whose slices hold it
    maxed = PrioritizedSliceSampler(
        rb.storage, 0.6, 0.4, slice_len=slice_len, slice_priority="max", generator=g
    )
    ReplayBuffer(rb.storage, sampler=maxed)  # indexes the episodes already written
    m = measure({"rbdata": lambda: maxed.update_priority(index, td_error), "floor": floor}, cfg)
    rep.info(f"  N={_size(n)}: update_priority({bs} items), max", m["rbdata"], m["floor"])
    return t["rbdata"], t["floor"]


def bench_prioritized_slices(cfg: Config, rep: Report) -> None:
    slice_len, bs = SLICE_LEN, SLICE_BATCH
    sizes = (100_000, 1_000_000) if cfg is _timing.QUICK else (1_000_000, 10_000_000)
    rep.section(
        f"3. PrioritizedSliceSampler(slice_len={slice_len}): draw({bs}) = {bs // slice_len} "
        f"slices by start priority, with weights; {EP_LEN}-step episodes, distinct priorities",
        f"uniform slice starts on plain tensors: randint(#episodes) + randint(offset) + "
        f"arange({slice_len})",
    )
    times: dict[int, tuple[float, float]] = {}
    for n in sizes:
        times[n] = _prioritized_slices_at(n, cfg, rep)  # the buffer is freed on return
        free()
    small, large = min(times), max(times)
    (t_small, f_small), (t_large, f_large) = times[small], times[large]
    rep.value(
        f"draw time at N={_size(large)} / at N={_size(small)}",
        t_large / t_small,
        1.5,
        text=f"{t_large * 1e6:.1f} us / {t_small * 1e6:.1f} us",
    )
    rep.value(
        f"ratio to floor at N={_size(large)} / at N={_size(small)}",
        (t_large / f_large) / (t_small / f_small),
        1.5,
        text=f"{t_large / f_large:.2f}x / {t_small / f_small:.2f}x",
    )
    if large != FULL_SIZES[-1]:
        rep.note(f"N={_size(FULL_SIZES[-1])} skipped in --quick")


# --- 4. sequences ---------------------------------------------------------------------------
SEQ_BURN_IN, SEQ_LENGTH, SEQ_BOOTSTRAP, SEQ_BATCH = 8, 16, 1, 32


def _sequences_at(n: int, cfg: Config, rep: Report) -> None:
    """Time SequenceSampler draws and samples from a full buffer of ``n`` steps."""
    width = SEQ_BURN_IN + SEQ_LENGTH + SEQ_BOOTSTRAP
    obs, done = _episodes(n, EP_LEN)
    episodes = n // EP_LEN
    g = torch.Generator().manual_seed(0)
    shape = {"burn_in": SEQ_BURN_IN, "bootstrap": SEQ_BOOTSTRAP}
    buffers = {}
    for name, prioritized in (("uniform", None), ("prioritized", (0.6, 0.4))):
        sampler = SequenceSampler(length=SEQ_LENGTH, prioritized=prioritized, generator=g, **shape)
        rb = ReplayBuffer(TensorStorage(n), sampler=sampler)
        for start in range(0, n, FILL_CHUNK):
            rb.extend(_td(obs[start : start + FILL_CHUNK], done[start : start + FILL_CHUNK]))
        buffers[name] = rb
    p = torch.rand(n, generator=g, dtype=torch.float64)
    buffers["prioritized"].update_priority(torch.arange(n), p)
    slices = ReplayBuffer(TensorStorage(n), sampler=SliceSampler(slice_len=width))
    for start in range(0, n, FILL_CHUNK):
        slices.extend(_td(obs[start : start + FILL_CHUNK], done[start : start + FILL_CHUNK]))
    arange = torch.arange(width)
    bs = SEQ_BATCH * width

    def floor_draw() -> torch.Tensor:  # windows inside one episode, no masks, no index
        ep = torch.randint(episodes, (SEQ_BATCH,), generator=g)
        off = torch.randint(EP_LEN - width + 1, (SEQ_BATCH,), generator=g)
        return ((ep * EP_LEN + off).unsqueeze(1) + arange).reshape(-1)

    def floor() -> tuple[torch.Tensor, torch.Tensor]:
        idx = floor_draw()
        return obs.index_select(0, idx), done.index_select(0, idx)

    uniform, prio = buffers["uniform"], buffers["prioritized"]
    t = measure(
        {
            "sample": lambda: uniform.sample(bs),
            "draw": lambda: uniform.sampler.draw(bs),
            "psample": lambda: prio.sample(bs),
            "slice": lambda: slices.sample(bs),
            "floor": floor,
            "floor_draw": floor_draw,
        },
        cfg,
    )
    size = _size(n)
    rep.ratio(f"N={size}: rb.sample({bs}), uniform anchors", t["sample"], t["floor"], 2.5)
    rep.info(f"  N={size}: sampler.draw({bs}) (vs the draw floor)", t["draw"], t["floor_draw"])
    rep.ratio(f"N={size}: rb.sample({bs}), prioritized + weight", t["psample"], t["floor"], 3.0)
    rep.info(f"  N={size}: SliceSampler(slice_len={width}) sample", t["slice"], t["floor"])


def bench_sequences(cfg: Config, rep: Report) -> None:
    width = SEQ_BURN_IN + SEQ_LENGTH + SEQ_BOOTSTRAP
    n = 100_000 if cfg is _timing.QUICK else 1_000_000
    rep.section(
        f"4. SequenceSampler(length={SEQ_LENGTH}, burn_in={SEQ_BURN_IN}, bootstrap="
        f"{SEQ_BOOTSTRAP}): {SEQ_BATCH} windows x {width} rows with validity/learning masks; "
        f"observation 4 floats + ('next', 'done'); {EP_LEN}-step episodes",
        f"randint(#episodes) + randint({EP_LEN} - {width} + 1) offset + arange({width}) + "
        "index_select on the 2 plain tensors (no masks); draw floor: the indices alone",
    )
    _sequences_at(n, cfg, rep)
    free()
    if cfg is _timing.QUICK:
        rep.note("N=1M in the full run; --quick uses N=100k")


WORKLOADS: list[Callable[[Config, Report], None]] = [
    bench_prioritized,
    bench_slices,
    bench_prioritized_slices,
    bench_sequences,
]


def main(argv: list[str] | None = None) -> int:
    """Run every workload; ``--quick`` for a smoke run."""
    return _timing.main(
        "rbdata sampler benchmarks", WORKLOADS, argv, quick_help="fewer, shorter repeats, no 10M"
    )


if __name__ == "__main__":
    sys.exit(main())
