"""A MixedBuffer through ``DataLoader`` (workers 0 and 2), ``StatefulDataLoader``, ``rbdata.nodes``
and its own checkpoints, with the D4RL sample as the offline source (RLPD's two sources).

Resumes are checked against the uninterrupted sequence; a checkpoint against a second
mixture built from scratch and sampled in the same order.
"""

from __future__ import annotations

import gc
from pathlib import Path

import pytest
import torch
from _mixed_data import ONLINE_KEYS, d4rl_sample, prioritized_buffer, storage
from torch.utils.data import DataLoader
from torchdata.nodes import Loader, Prefetcher
from torchdata.stateful_dataloader import StatefulDataLoader

from rbdata import MixedBuffer, PrioritizedSampler, ReplayBuffer, TensorStorage, UniformSampler
from rbdata.errors import CheckpointError
from rbdata.nodes import BufferSource

pytestmark = pytest.mark.usefixtures("collect_pipelines")


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("mixed-d4rl")


def _online(seed: int) -> ReplayBuffer:
    sampler = UniformSampler(generator=torch.Generator().manual_seed(seed))
    rb = ReplayBuffer(TensorStorage(500), sampler)
    return rb


def _rlpd(root: Path, seed: int, n_online: int = 40) -> MixedBuffer:
    ds = d4rl_sample(root)
    ds.sampler.generator.manual_seed(seed)
    rb = _online(seed + 1)
    if n_online:
        rb.extend(ds.storage[torch.arange(n_online)].select(*ONLINE_KEYS))
    return MixedBuffer(
        {"offline": ds, "online": rb}, {"offline": 0.5, "online": 0.5}, keys=ONLINE_KEYS
    )


def test_rlpd_pattern_with_the_d4rl_sample(root: Path) -> None:
    mixed = _rlpd(root, seed=0)
    batch = mixed.sample(256)
    assert batch["source"].tolist() == [0] * 128 + [1] * 128
    ds, rb = mixed.sources["offline"], mixed.sources["online"]
    position, local = mixed.locate(batch["index"])
    assert mixed.offsets == {"offline": 0, "online": len(ds)}
    for pos, src in ((0, ds.storage), (1, rb.storage)):
        rows_ = src[local[position == pos]]
        assert torch.equal(rows_["observation"], batch["observation"][position == pos])


@pytest.mark.parametrize("num_workers", [0, 2])
def test_dataloader_batches_equal_sample(root: Path, num_workers: int) -> None:
    loader = DataLoader(
        _rlpd(root, seed=3).dataset,
        batch_sampler=_rlpd(root, seed=3).batch_sampler(64, num_batches=4),
        num_workers=num_workers,
    )
    # the batch sampler draws with the second mixture; the dataset only gathers
    reference = _rlpd(root, seed=3)
    expected = [reference.sample(64) for _ in range(4)]
    got = list(loader)
    assert len(got) == 4
    for batch, ref in zip(got, expected, strict=True):
        assert torch.equal(batch["index"], ref["index"])
        assert torch.equal(batch["source"], ref["source"])
        assert torch.equal(batch["next", "reward"], ref["next", "reward"])


def test_the_dataset_gathers_any_order_of_combined_indices(root: Path) -> None:
    mixed = _rlpd(root, seed=0)
    n = len(mixed.sources["offline"])
    batch = mixed.dataset[[n + 2, 5, n, 7]]
    assert batch["source"].tolist() == [1, 0, 1, 0]
    assert batch["index"].tolist() == [n + 2, 5, n, 7]
    offline = mixed.sources["offline"].storage
    assert torch.equal(batch["observation"][1], offline[5]["observation"])
    assert torch.equal(batch["observation"][2], offline[0]["observation"])  # online row 0
    with pytest.raises(IndexError, match="row 100 of source 'online', which holds 40"):
        mixed.dataset[[n + 100]]
    assert mixed.dataset[n + 1]["index"].item() == n + 1


@pytest.mark.parametrize("num_workers", [0, 2])
def test_stateful_dataloader_resumes_the_sequence(root: Path, num_workers: int) -> None:
    def loader(mixed: MixedBuffer) -> StatefulDataLoader:
        return StatefulDataLoader(
            mixed.dataset, batch_sampler=mixed.batch_sampler(32, 8), num_workers=num_workers
        )

    mixed = _rlpd(root, seed=5)
    first = loader(mixed)
    it = iter(first)
    for _ in range(3):
        next(it)
    state = first.state_dict()
    expected = [b["index"].tolist() for b in it]
    other = _rlpd(root, seed=77)
    other.weights = {"offline": 1.0, "online": 0.0}  # restored by the state too
    resumed = loader(other)
    resumed.load_state_dict(state)
    assert [b["index"].tolist() for b in resumed] == expected
    del it, first, resumed
    gc.collect()


def test_nodes_source_resumes_with_weights_and_draw_state() -> None:
    def mixture(seed: int) -> MixedBuffer:
        return MixedBuffer(
            {"a": prioritized_buffer(64, 50, 0, seed), "b": storage(30, 1000)},
            {"a": 0.25, "b": 0.75},
            generator=torch.Generator().manual_seed(seed),
        )

    mixed = mixture(1)
    node = BufferSource(mixed, batch_size=16, num_batches=6)
    loader = Loader(node)
    it = iter(loader)
    seen = [next(it) for _ in range(2)]
    mixed.update_priority(seen[0]["index"], torch.rand(16) + 0.5)
    state = loader.state_dict()
    expected = [b["index"].tolist() for b in it]
    # another mixture with the same priorities (data, not pipeline state) but other seeds
    other = mixture(9)
    other.sources["a"].sampler.load_state_dict(mixed.sources["a"].sampler.state_dict())
    other.weights = {"a": 1.0, "b": 1.0}
    again = Loader(BufferSource(other, batch_size=16, num_batches=6))
    again.load_state_dict(state)
    assert [b["index"].tolist() for b in again] == expected
    assert dict(other.weights) == {"a": 0.25, "b": 0.75}
    prefetched = Loader(Prefetcher(BufferSource(mixture(2), batch_size=8, num_batches=3), 2))
    assert [b["source"].tolist().count(1) for b in prefetched] == [6, 6, 6]


# --- checkpoints ------------------------------------------------------------------------------
def test_dumps_loads_three_kinds_of_source(root: Path, tmp_path: Path) -> None:
    def build(seed: int) -> MixedBuffer:
        ds = d4rl_sample(root)
        per = PrioritizedSampler(len(ds), alpha=1.0, beta=0.4)
        per.generator.manual_seed(seed)
        extra = TensorStorage(50)
        extra.set(slice(0, 20), ds.storage[torch.arange(20)].exclude("index"))
        return MixedBuffer(
            {"offline": ds, "extra": extra},
            {"offline": 0.6, "extra": 0.4},
            samplers={"offline": per},
            generator=torch.Generator().manual_seed(seed),
        )

    mixed = build(1)
    batch = mixed.sample(20)
    mixed.update_priority(batch["index"], torch.arange(20.0) + 1)
    mixed.dumps(tmp_path / "ckpt", fsync=False)
    expected = [mixed.sample(20)["index"].tolist() for _ in range(3)]
    priorities = mixed.samplers["offline"].priority_values()
    fresh = MixedBuffer.loads(tmp_path / "ckpt")
    assert isinstance(fresh.samplers["offline"], PrioritizedSampler)
    assert torch.equal(fresh.samplers["offline"].priority_values(), priorities)
    assert [fresh.sample(20)["index"].tolist() for _ in range(3)] == expected
    into = build(2)
    into.load(tmp_path / "ckpt")
    assert [into.sample(20)["index"].tolist() for _ in range(3)] == expected


def test_dumps_loads_round_trip(root: Path, tmp_path: Path) -> None:
    mixed = _rlpd(root, seed=11)
    mixed.sample(16)
    mixed.weights = {"offline": 0.3, "online": 0.7}
    mixed.dumps(tmp_path / "ckpt", fsync=False)
    expected = [mixed.sample(16)["index"].tolist() for _ in range(3)]
    fresh = MixedBuffer.loads(tmp_path / "ckpt")  # a new mixture
    assert dict(fresh.weights) == {"offline": 0.3, "online": 0.7}
    assert len(fresh.sources["online"]) == 40
    assert [fresh.sample(16)["index"].tolist() for _ in range(3)] == expected
    into = _rlpd(root, seed=50, n_online=3)  # loaded in place: items, states, weights
    assert into.loads(tmp_path / "ckpt") is into
    assert len(into.sources["online"]) == 40
    assert [into.sample(16)["index"].tolist() for _ in range(3)] == expected


def test_loads_refuses_another_dataset(root: Path, tmp_path: Path) -> None:
    mixed = _rlpd(root, seed=11)
    mixed.dumps(tmp_path / "ckpt", fsync=False)
    other = d4rl_sample(root, backend="arrow")
    with pytest.raises(ValueError, match=r"sources\['offline'\]: a different dataset.*backend"):
        MixedBuffer.loads(tmp_path / "ckpt", datasets={"offline": other})
    target = MixedBuffer(
        {"offline": other, "online": _online(0)}, {"offline": 1, "online": 1}, keys=ONLINE_KEYS
    )
    before = target.state_dict()
    with pytest.raises(ValueError, match="a different dataset"):
        target.load(tmp_path / "ckpt")
    assert len(target.sources["online"]) == 0
    assert torch.equal(
        target.state_dict()["samplers"]["online"]["generator"],
        before["samplers"]["online"]["generator"],
    )
    with pytest.raises(CheckpointError):
        MixedBuffer.loads(tmp_path)  # not a checkpoint
    renamed = MixedBuffer({"x": storage(3, 0)}, {"x": 1})
    with pytest.raises(
        ValueError,
        match=r"the checkpoint holds the sources .*: build the mixture "
        r"with the same sources, in the same order, as when it was saved",
    ):
        renamed.load(tmp_path / "ckpt")
    swapped = MixedBuffer(
        {"online": _online(0), "offline": other}, {"offline": 1, "online": 1}, keys=ONLINE_KEYS
    )
    with pytest.raises(
        ValueError,
        match=r"\('offline', 'dataset'\), \('online', 'buffer'\)\], "
        r"this mixture has \[\('online', 'buffer'\), \('offline', 'dataset'\)\]: build",
    ):
        swapped.load(tmp_path / "ckpt")
