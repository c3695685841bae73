"""``HindsightRelabel`` against per-item brute force: goal sets, exact draws, distributions."""

from __future__ import annotations

import math
import pickle
import random
import threading
from collections import Counter

import numpy as np
import pytest
import torch

from rbdata import (
    HindsightRelabel,
    ListStorage,
    ReplayBuffer,
    SliceSampler,
    TensorStorage,
    UniformSampler,
)
from rbdata.transforms._goals import uniforms
from rbdata.transforms._goals_reference import uniforms_reference
from tests._ring import Ring

STRATEGIES = ["future", "final", "episode"]


def fetch_reward(achieved: torch.Tensor, desired: torch.Tensor, info: object) -> torch.Tensor:
    """gymnasium-robotics' Fetch reward: 0 within 0.05 of the goal, else -1."""
    return -(torch.linalg.vector_norm(achieved - desired, dim=-1) > 0.05).float()


def steps(model: Ring, done: list[bool]) -> dict:
    """Items whose achieved goals name their step: ``(t, episode)``, next ``(t + 0.5, ...)``."""
    start = len(model.done)
    model.write(done)
    n = len(done)
    t = torch.arange(start, start + n, dtype=torch.float64)
    ep = torch.tensor(model.episode[start:], dtype=torch.float64)
    return {
        "observation": {
            "achieved_goal": torch.stack([t, ep], 1),
            "desired_goal": torch.full((n, 2), -5.0, dtype=torch.float64),
        },
        "next": {
            "observation": {
                "achieved_goal": torch.stack([t + 0.5, ep], 1),
                "desired_goal": torch.full((n, 2), -5.0, dtype=torch.float64),
            },
            "reward": torch.full((n, 1), 7.0),
            "done": torch.tensor(done).reshape(n, 1),
        },
    }


def filled(capacity: int, n: int, seed: int = 0, p_end: float = 0.15, storage=None):
    """A buffer of ``capacity`` after ``n`` random steps written in chunks, and its model."""
    rng = random.Random(seed)
    model = Ring(capacity)
    rb = ReplayBuffer(storage if storage is not None else TensorStorage(capacity))
    while len(model.done) < n:
        k = min(rng.randint(1, capacity // 2), n - len(model.done))
        rb.extend(steps(model, [rng.random() < p_end for _ in range(k)]))
    return rb, model


def relabel(her: HindsightRelabel, rb: ReplayBuffer, index: torch.Tensor):
    """The plain batch at ``index`` and the relabeled one."""
    plain = rb.storage.gather(index, {"index": index})
    return plain, her(plain.clone())


def allowed(strategy: str, t: int, s: int, e: int) -> set[int]:
    """The goal steps each strategy may choose for step ``t`` of episode ``[s, e]``."""
    return {"future": set(range(t, e + 1)), "final": {e}, "episode": set(range(s, e + 1))}[strategy]


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("storage", ["tensor", "list"])
def test_goals_rewards_and_kept_items_against_brute_force(strategy: str, storage: str) -> None:
    capacity = 40
    store = TensorStorage(capacity) if storage == "tensor" else ListStorage(capacity)
    her = HindsightRelabel(
        store, strategy=strategy, reward_fn=fetch_reward, generator=torch.Generator().manual_seed(1)
    )
    rb, model = filled(capacity, 25, storage=store)
    rng = random.Random(3)
    for _round in range(12):  # writes through the ring between samples: overwrites, running
        done = [rng.random() < 0.2 for _ in range(rng.randint(1, 15))]
        rb.extend(steps(model, done))
        index = torch.randint(len(store), (64,))
        plain, batch = relabel(her, rb, index)
        goal_index = batch["goal_index"]
        assert int((goal_index >= 0).sum()) == int(0.8 * 64)
        for i in range(64):
            slot = int(index[i])
            goal = batch["observation", "desired_goal"][i]
            if goal_index[i] < 0:  # kept: bitwise as sampled
                for key in plain.keys(True, True):
                    assert torch.equal(batch[key][i], plain[key][i]), key
                continue
            t, s, e = model.times(slot)
            g = model.slot_time[int(goal_index[i])]
            assert g in allowed(strategy, t, s, e)
            assert model.episode[g] == model.episode[t]  # never across an episode
            assert goal.tolist() == [g + 0.5, model.episode[g]]  # ("next", achieved) of g
            assert torch.equal(batch["next", "observation", "desired_goal"][i], goal)
            achieved = plain["next", "observation", "achieved_goal"][i]
            reward = 0.0 if torch.linalg.vector_norm(achieved - goal) <= 0.05 else -1.0
            assert batch["next", "reward"][i].tolist() == [reward]
            assert reward == (0.0 if g == t else -1.0)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_goal_slots_equal_a_per_item_replay_of_the_same_draws(strategy: str) -> None:
    """The k-th batch's seed is the generator's k-th draw: a per-item Python replay of it
    picks the very same goals (across the 64-draw blocks the transform takes at once)."""
    capacity, n, batch = 30, 77, 50
    rb, model = filled(capacity, n, seed=7)
    gen = torch.Generator().manual_seed(11)
    her = HindsightRelabel(
        rb.storage, strategy=strategy, her_ratio=0.5, reward_fn=fetch_reward, generator=gen
    )
    replay = torch.Generator().manual_seed(11)
    for k in range(70):
        index = torch.randint(capacity, (batch,))
        got = her(rb.storage.gather(index, {"index": index}))["goal_index"].tolist()
        seed = int(torch.empty((), dtype=torch.int64).random_(generator=replay))
        if k % 13:
            continue  # the replay's draws stay in step; every 13th batch is checked
        u = uniforms_reference(seed, batch)  # SplitMix64 in plain Python
        order = list(range(batch))
        for i in range(batch // 2):  # the random subset: a partial Fisher-Yates shuffle
            j = i + min(int(u[i, 0] * (batch - i)), batch - i - 1)
            order[i], order[j] = order[j], order[i]
        expected = [-1] * batch
        for i in order[: batch // 2]:
            t, s, e = model.times(int(index[i]))
            v = float(u[i, 1])
            g = {
                "future": t + int(v * (e - t + 1)),
                "final": e,
                "episode": s + int(v * (e - s + 1)),
            }
            expected[i] = g[strategy] % capacity
        assert got == expected


def test_the_kernel_uniforms_equal_the_python_splitmix64() -> None:
    for seed in (0, 1, 12345, 2**63 - 1):
        assert np.array_equal(uniforms(seed, 33), uniforms_reference(seed, 33))
    # SplitMix64's published first output from seed 0
    assert uniforms_reference(0, 1)[0, 0] == (0xE220A8397B1DCDAF >> 11) / 2.0**53


def chi_square_ok(counts: Counter, probs: dict[int, float], draws: int) -> None:
    """Every drawn value is allowed, and the counts fit ``probs`` (a far-tail chi-square)."""
    assert set(counts) <= {k for k, p in probs.items() if p > 0}, set(counts) - set(probs)
    support = [k for k, p in probs.items() if p > 0]
    stat = sum((counts[k] - draws * probs[k]) ** 2 / (draws * probs[k]) for k in support)
    dof = max(len(support) - 1, 1)
    assert stat < dof + 6 * math.sqrt(2 * dof) + 10, (stat, dof)


def draw_goals(her: HindsightRelabel, rb: ReplayBuffer, model: Ring, slot: int) -> Counter:
    counts: Counter = Counter()
    for _ in range(10):
        index = torch.full((2000,), slot)
        goal_index = her(rb.storage.gather(index, {"index": index}))["goal_index"]
        counts.update(model.slot_time[int(s)] for s in goal_index.tolist())
    return counts


def one_episode(length: int, capacity: int = 100, written: int | None = None):
    """A buffer holding one finished episode of ``length`` steps (after ``written`` others)."""
    model = Ring(capacity)
    rb = ReplayBuffer(TensorStorage(capacity))
    if written:
        rb.extend(steps(model, [False] * (written - 1) + [True]))
    rb.extend(steps(model, [False] * (length - 1) + [True]))
    return rb, model


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_distributions_are_exact(strategy: str) -> None:
    rb, model = one_episode(12, written=5)  # the episode holds times 5..16
    her = HindsightRelabel(
        rb.storage, strategy=strategy, her_ratio=1.0, reward_fn=fetch_reward,
        generator=torch.Generator().manual_seed(0),
    )  # fmt: skip
    t, s, e = 8, 5, 16
    probs = {
        "future": {g: 1 / (e - t + 1) for g in range(t, e + 1)},
        "final": {e: 1.0},
        "episode": {g: 1 / (e - s + 1) for g in range(s, e + 1)},
    }[strategy]
    chi_square_ok(draw_goals(her, rb, model, slot=t), probs, 20000)


def ogbench_probs(t: int, e: int, held: list[int], probs, geom: bool, gamma: float):
    """OGBench's ``sample_goals`` distribution for step ``t`` of an episode ending at ``e``."""
    p_cur, p_traj, p_random = probs
    out = Counter({t: p_cur})
    if geom:  # min(t + k, e), k >= 1 geometric: P(k) = (1 - gamma) * gamma ** (k - 1)
        for k in range(1, e - t):
            out[t + k] += p_traj * (1 - gamma) * gamma ** (k - 1)
        out[e] += p_traj * gamma ** max(e - t - 1, 0)
    else:  # round(a * v + e * (1 - v)), v uniform: the two ends get half a share
        a = min(t + 1, e)
        if a == e:
            out[e] += p_traj
        else:
            for g in range(a, e + 1):
                out[g] += p_traj * (0.5 if g in (a, e) else 1.0) / (e - a)
    for g in held:
        out[g] += p_random / len(held)
    return dict(out)


@pytest.mark.parametrize("geom", [False, True])
@pytest.mark.parametrize("probs", [(0.0, 1.0, 0.0), (0.2, 0.5, 0.3)])
def test_ogbench_goal_distribution_is_exact(geom: bool, probs) -> None:
    rb, model = one_episode(12, written=5)
    her = HindsightRelabel(
        rb.storage, strategy="ogbench", her_ratio=1.0, reward_fn=fetch_reward,
        goal_probs=probs, geom_sample=geom, discount=0.7,
        generator=torch.Generator().manual_seed(0),
    )  # fmt: skip
    for t in (8, 15, 16):
        expected = ogbench_probs(t, 16, list(range(17)), probs, geom, 0.7)
        chi_square_ok(draw_goals(her, rb, model, slot=t), expected, 20000)


def test_the_relabeled_subset_is_uniform_and_exactly_sized() -> None:
    rb, _ = one_episode(30)
    her = HindsightRelabel(rb.storage, her_ratio=0.3, reward_fn=fetch_reward)
    hits = torch.zeros(10)
    for _ in range(2000):
        index = torch.arange(10)
        relabeled = her(rb.storage.gather(index, {"index": index}))["goal_index"] >= 0
        assert int(relabeled.sum()) == 3
        hits += relabeled
    chi_square_ok(Counter(dict(enumerate(hits.tolist()))), dict.fromkeys(range(10), 0.1), 6000)
    # her_ratio is assignable (annealed): the next batches relabel the new count
    index = torch.arange(10)
    for ratio, count in ((0.75, 7), (1.0, 10), (0.0, 0), (0.3, 3)):
        her.her_ratio = ratio
        relabeled = her(rb.storage.gather(index, {"index": index}))["goal_index"] >= 0
        assert int(relabeled.sum()) == count
    for bad in (1.5, -0.5, float("nan")):
        with pytest.raises(ValueError, match=r"her_ratio must be in \[0, 1\]"):
            her.her_ratio = bad
    assert her.her_ratio == 0.3


def test_running_and_ring_cut_episodes() -> None:
    """future/final stop at the newest step; an overwritten start is the oldest step held."""
    capacity = 10
    model = Ring(capacity)
    rb = ReplayBuffer(TensorStorage(capacity))
    rb.extend(steps(model, [False] * 7 + [True]))  # times 0..7
    rb.extend(steps(model, [False] * 6))  # times 8..13, still running; 0..3 overwritten
    for strategy, slot, expected in [
        ("final", 3 % capacity, 13),  # running: its final step is the newest
        ("episode", 5, set(range(4, 8))),  # ring-cut: from the oldest held (4) to its end
        ("future", 11 % capacity, set(range(11, 14))),
    ]:
        her = HindsightRelabel(rb.storage, strategy=strategy, her_ratio=1.0, reward_fn=fetch_reward)
        index = torch.full((400,), slot)
        goals = {
            model.slot_time[int(s)]
            for s in her(rb.storage.gather(index, {"index": index}))["goal_index"]
        }
        assert goals == (expected if isinstance(expected, set) else {expected})


def test_storage_untouched_reproducible_and_state_dict() -> None:
    rb, _ = filled(50, 120, seed=2)
    before = [b.clone() for b in rb.storage.buffers]
    her = HindsightRelabel(
        rb.storage, reward_fn=fetch_reward, generator=torch.Generator().manual_seed(4)
    )
    rb.transform = her
    state, sampler_state = her.state_dict(), rb.sampler.state_dict()
    first = [rb.sample(32) for _ in range(3)]
    her.load_state_dict(state)
    rb.sampler.load_state_dict(sampler_state)
    again = [rb.sample(32) for _ in range(3)]
    for a, b in zip(first, again, strict=True):
        assert (a == b).all()
    assert all(torch.equal(x, y) for x, y in zip(before, rb.storage.buffers, strict=True))


def test_state_dict_keeps_the_draws_taken_but_not_used() -> None:
    """The seeds come 64 at a time: a state saved mid-block resumes the very same goals."""
    rb, _ = filled(50, 120, seed=2)
    index = torch.randint(50, (32,))

    def goals(her: HindsightRelabel, count: int) -> list[list[int]]:
        return [her(rb.storage.gather(index, {"index": index}))["goal_index"].tolist()
                for _ in range(count)]  # fmt: skip

    her = HindsightRelabel(rb.storage, reward_fn=fetch_reward, generator=torch.Generator())
    goals(her, 5)
    state = her.state_dict()
    first = goals(her, 70)  # past the end of the block
    other = HindsightRelabel(
        rb.storage, reward_fn=fetch_reward, generator=torch.Generator().manual_seed(99)
    )
    other.load_state_dict(state)
    assert goals(other, 70) == first
    assert len(set(map(tuple, first))) > 60  # the draws do differ from batch to batch


@pytest.mark.parametrize("strategy", [*STRATEGIES, "ogbench"])
def test_on_sampled_writes_in_place_what_the_call_returns(strategy: str) -> None:
    """ReplayBuffer's ``on_sampled`` call: the same batch as calling the transform, written
    into the gathered tensors; the call itself leaves tensors held elsewhere alone."""
    rb, _ = filled(64, 150, seed=3)
    make = lambda: HindsightRelabel(  # noqa: E731
        rb.storage, strategy=strategy, reward_fn=fetch_reward,
        generator=torch.Generator().manual_seed(5),
    )  # fmt: skip
    called, sampled = make(), make()
    keys = [("observation", "desired_goal"), ("next", "observation", "desired_goal")]
    keys.append(("next", "reward"))
    for _ in range(5):
        index = torch.randint(64, (40,))
        gathered = rb.storage.gather(index, {"index": index})
        fresh = gathered.clone()  # another gather of the same rows
        held = {key: gathered[key] for key in keys}
        before = {key: value.clone() for key, value in held.items()}
        a = called(gathered)
        for key in keys:  # replaced in the batch, the held tensors untouched
            assert torch.equal(held[key], before[key]) and a[key] is not held[key]
        objects = {key: fresh[key] for key in keys}
        b = sampled.on_sampled(fresh)
        assert set(a.keys(True, True)) == set(b.keys(True, True))
        for key in a.keys(True, True):
            assert torch.equal(a[key], b[key]), key
        for key in keys:  # written into the gathered tensors
            assert b[key] is objects[key]
        assert (b["goal_index"] >= 0).sum() == int(0.8 * 40)
    # through the buffer: sample() calls on_sampled; the storage is never written
    stored = [buf.clone() for buf in rb.storage.buffers]
    rb.transform = sampled
    for _ in range(20):
        batch = rb.sample(32)
        relabeled = batch["goal_index"] >= 0
        assert int(relabeled.sum()) == int(0.8 * 32)
        goals = rb.storage.gather(batch["goal_index"][relabeled], None)[sampled.goal_key]
        assert torch.equal(batch["observation", "desired_goal"][relabeled], goals)
    assert all(torch.equal(a, b) for a, b in zip(stored, rb.storage.buffers, strict=True))


@pytest.mark.parametrize("strategy", [*STRATEGIES, "ogbench"])
def test_random_writes_and_samples_fast_and_general_paths_agree(strategy: str) -> None:
    """Random interleavings of writes (ring wrap-arounds, episodes cut by the ring, running
    episodes) and samples: a ReplayBuffer on a TensorStorage (``on_sampled``, the fused
    in-place kernel) and one on a ListStorage (the general path) give the same batches."""
    capacity = 48
    rng = random.Random(11)
    buffers, models = [], []
    for storage in (TensorStorage(capacity), ListStorage(capacity)):
        her = HindsightRelabel(
            storage, strategy=strategy, reward_fn=fetch_reward,
            generator=torch.Generator().manual_seed(3),
        )  # fmt: skip
        sampler = UniformSampler(generator=torch.Generator().manual_seed(4))
        buffers.append(ReplayBuffer(storage, sampler, transform=her))
        models.append(Ring(capacity))
    for _ in range(60):
        if rng.random() < 0.4 or len(buffers[0]) == 0:
            done = [rng.random() < 0.2 for _ in range(rng.randint(1, 30))]
            for rb, model in zip(buffers, models, strict=True):
                rb.extend(steps(model, done))
        else:
            size = rng.randint(1, 40)
            a, b = (rb.sample(size) for rb in buffers)
            assert set(a.keys(True, True)) == set(b.keys(True, True))
            for key in a.keys(True, True):
                assert torch.equal(a[key], b[key]), key
    # the in-place writes went to the batches only: both storages still hold the same steps
    every = torch.arange(len(buffers[0]))
    held = [rb.storage.gather(every, None) for rb in buffers]
    for key in held[0].keys(True, True):
        assert torch.equal(held[0][key], held[1][key]), key


def test_one_transform_called_from_several_threads() -> None:
    """Threads share the kernel scratch and the episode index (a ``ParallelMapper`` of one
    transform): every goal stays an allowed one (without the draw lock, most runs had
    thousands that were not), and the transform pickles (its lock made anew)."""
    capacity = 400
    rb, model = filled(capacity, 900, seed=5)
    her = HindsightRelabel(rb.storage, strategy="future", reward_fn=fetch_reward)
    bounds = torch.tensor([model.times(slot) for slot in range(capacity)])  # (t, s, e)
    slot_time = torch.tensor([model.slot_time[slot] for slot in range(capacity)])
    wrong = []

    def work(seed: int) -> None:
        gen = torch.Generator().manual_seed(seed)
        for _ in range(60):
            index = torch.randint(capacity, (4096,), generator=gen)  # one size: one scratch
            goal = her(rb.storage.gather(index, {"index": index}))["goal_index"]
            relabeled = goal >= 0
            t, e, g = bounds[index, 0], bounds[index, 2], slot_time[goal.clamp(min=0)]
            ok = ~relabeled | ((g >= t) & (g <= e))
            wrong.append(int((~ok).sum()) + abs(int(relabeled.sum()) - int(0.8 * 4096)))

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(wrong) == 240 and sum(wrong) == 0
    copy = pickle.loads(pickle.dumps(her))
    index = torch.arange(capacity)
    assert int((copy(rb.storage.gather(index, {"index": index}))["goal_index"] >= 0).sum()) == 320


def test_with_a_slice_sampler() -> None:
    capacity = 64
    store = TensorStorage(capacity)
    her = HindsightRelabel(store, strategy="future", reward_fn=fetch_reward)
    rb = ReplayBuffer(store, sampler=SliceSampler(slice_len=4), transform=her)
    model = Ring(capacity)
    for _ in range(6):
        rb.extend(steps(model, [False] * 15 + [True]))
    batch = rb.sample(32)
    ag = batch["observation", "achieved_goal"]
    goal = batch["observation", "desired_goal"]
    rows = batch["goal_index"] >= 0
    assert (goal[rows, 1] == ag[rows, 1]).all() and (goal[rows, 0] >= ag[rows, 0] + 0.5).all()


@pytest.mark.parametrize(
    "arg", ["achieved_key", "desired_key", "reward_key", "end_key", "traj_key"]
)
def test_every_key_argument_is_checked(arg: str) -> None:
    store = one_episode(5)[0].storage
    for bad in ("", ("next", ""), ("",)):
        with pytest.raises(ValueError, match=rf"^{arg}: expected a key of non-empty names"):
            HindsightRelabel(store, reward_fn=fetch_reward, **{arg: bad})
    for bad in ((), ("next", 1), 3, ["next", "done"]):
        with pytest.raises(TypeError, match=rf"^{arg}: expected a str or a non-empty tuple"):
            HindsightRelabel(store, reward_fn=fetch_reward, **{arg: bad})


def test_helpful_errors() -> None:
    rb, _ = one_episode(5)
    store = rb.storage
    with pytest.raises(ValueError, match="strategy must be one of"):
        HindsightRelabel(store, strategy="past", reward_fn=fetch_reward)
    for ratio in (-0.1, 1.5):
        with pytest.raises(ValueError, match=r"her_ratio must be in \[0, 1\]"):
            HindsightRelabel(store, her_ratio=ratio, reward_fn=fetch_reward)
    with pytest.raises(TypeError, match="reward_fn must be callable"):
        HindsightRelabel(store, reward_fn=None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="only for strategy='ogbench'"):
        HindsightRelabel(store, reward_fn=fetch_reward, goal_probs=(0, 1, 0))
    with pytest.raises(ValueError, match="sum to 1"):
        HindsightRelabel(
            store, strategy="ogbench", reward_fn=fetch_reward, goal_probs=(0.5, 0.6, 0)
        )
    with pytest.raises(ValueError, match="discount"):
        HindsightRelabel(store, strategy="ogbench", reward_fn=fetch_reward, discount=1.0)
    index = torch.arange(4)
    batch = store.gather(index, {"index": index})
    with pytest.raises(KeyError, match="'index'") as err:
        HindsightRelabel(store, reward_fn=fetch_reward)(batch.exclude("index"))
    assert str(err.value).startswith("HindsightRelabel needs the batch's 'index'")
    assert "\\" not in str(err.value)  # printed as written, not repr'd with \'
    with pytest.raises(KeyError, match="no achieved goal"):
        HindsightRelabel(store, reward_fn=fetch_reward, achieved_key="goal")(batch.clone())
    with pytest.raises(KeyError, match="no desired goal"):
        HindsightRelabel(store, reward_fn=fetch_reward, desired_key="goal")(batch.clone())
    bad = HindsightRelabel(store, her_ratio=1.0, reward_fn=lambda a, d, i: torch.zeros(4, 2))
    with pytest.raises(ValueError, match=r"reward_fn returned shape \(4, 2\)"):
        bad(batch.clone())
    with pytest.raises(TypeError, match="TensorDict"):
        HindsightRelabel(store, reward_fn=fetch_reward)(torch.zeros(4))
    numpy_reward = HindsightRelabel(store, her_ratio=1.0, reward_fn=lambda a, d, i: np.zeros(4))
    assert numpy_reward(batch.clone())["next", "reward"].shape == (4, 1)


def test_ogbench_goals_on_an_ogbench_dataset(tmp_path) -> None:
    """OGBench's goal sampling over a converted OGBench file: goals never leave a trajectory."""
    from rbdata.datasets import OGBench
    from tests._ogbench_files import write_ogbench_file

    file = tmp_path / "pointmaze-medium-navigate-v0.npz"
    write_ogbench_file(file, n=400, infos=False)
    ds = OGBench("pointmaze-medium-navigate-v0", tmp_path / "home", file=file, progress=False)
    her = HindsightRelabel(
        ds.storage, strategy="ogbench", her_ratio=1.0, achieved_key="observation",
        desired_key="goal", goal_probs=(0.1, 0.9, 0.0), geom_sample=False, traj_key="episode",
        reward_fn=lambda a, d, info: (info["goal_index"] == info["index"]).float() - 1.0,
        generator=torch.Generator().manual_seed(0),
    )  # fmt: skip
    ds.buffer.transform = her
    rows = ds[:]
    for _ in range(5):
        batch = ds.sample(128)
        index, goal = batch["index"], batch["goal_index"]
        assert (rows["episode"][goal] == rows["episode"][index]).all()
        assert (goal >= index).all()
        assert torch.equal(batch["goal"], rows["observation"][goal])
        assert torch.equal(batch["next", "reward"].squeeze(1), (goal == index).float() - 1.0)


@pytest.mark.parametrize("strategy", [*STRATEGIES, "ogbench"])
def test_the_cpu_kernel_path_equals_the_general_path(strategy: str) -> None:
    """Tensor storage (one fused kernel) and list storage (gather + torch.where): same batch."""
    capacity = 40
    fast, slow = TensorStorage(capacity), ListStorage(capacity)
    filled(capacity, 90, seed=4, storage=fast)
    filled(capacity, 90, seed=4, storage=slow)
    make = lambda store: HindsightRelabel(  # noqa: E731
        store, strategy=strategy, reward_fn=fetch_reward, generator=torch.Generator().manual_seed(2)
    )
    her_fast, her_slow = make(fast), make(slow)
    for step in range(6):
        if step == 3:
            # torch moves the storage's memory under the kept column plan (same tensor
            # objects, new addresses): the next batches read the moved memory
            addresses = [buf.data_ptr() for buf in fast.buffers]
            for buf in fast.buffers:
                buf.share_memory_()
            assert addresses != [buf.data_ptr() for buf in fast.buffers]
            # new steps in the moved memory (the old memory would still hold the old ones)
            filled(capacity, 25, seed=9, storage=fast)
            filled(capacity, 25, seed=9, storage=slow)
        index = torch.randint(capacity, (37,))
        a = her_fast(fast.gather(index, {"index": index}))
        b = her_slow(slow.gather(index, {"index": index}))
        assert set(a.keys(True, True)) == set(b.keys(True, True))
        for key in a.keys(True, True):
            assert torch.equal(a[key], b[key]), key
    # a batch the kernel cannot take as it is (non-contiguous goals, another dtype next goal)
    index = torch.arange(6)
    batch = fast.gather(index, {"index": index})
    batch["observation", "desired_goal"] = batch["observation", "desired_goal"].t().contiguous().t()
    batch["next", "observation", "desired_goal"] = batch[
        "next", "observation", "desired_goal"
    ].float()
    out = her_fast(batch)
    relabeled = out["goal_index"] >= 0
    assert torch.equal(
        out["next", "observation", "desired_goal"][relabeled],
        out["observation", "desired_goal"][relabeled].float(),
    )
