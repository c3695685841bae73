"""RayReplayBuffer: collectors and a learner on a local 2-CPU Ray, sharding, checkpoints."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator

import numpy as np
import pytest
import torch
from tensordict import TensorDict

ray = pytest.importorskip("ray")

from rbdata import (  # noqa: E402
    MemmapStorage,
    PrioritizedSampler,
    RoundRobinWriter,
    TensorStorage,
    UniformSampler,
    distributed,
)
from rbdata.distributed import RayReplayBuffer, global_weights, split_index  # noqa: E402
from rbdata.errors import MissingExtraError  # noqa: E402

# Ray 2.60 raises no Python warning here; should a later Ray deprecate something it calls
# itself, that is not ours (filterwarnings = error in pyproject): ignore it for Ray's modules only
pytestmark = [
    pytest.mark.filterwarnings("ignore::DeprecationWarning:ray.*"),
    pytest.mark.filterwarnings("ignore::FutureWarning:ray.*"),
]


@pytest.fixture(scope="module")
def ray_local() -> Iterator[None]:
    # pytest imports this file under a name Ray workers cannot import: ship it by value
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        yield
    finally:
        ray.shutdown()


def batch(ids: np.ndarray) -> TensorDict:
    """Items whose every field is derived from its id (so contents can be checked)."""
    ids_t = torch.as_tensor(ids, dtype=torch.long)
    n = len(ids_t)
    return TensorDict(
        {
            "id": ids_t,
            "observation": ids_t.double().unsqueeze(-1).expand(n, 3).float() * 0.5,
            "next": {"reward": -ids_t.float()},
        },
        batch_size=[n],
    )


def check_rows(td: TensorDict) -> None:
    ids = td["id"]
    assert torch.equal(td["observation"], ids.double().unsqueeze(-1).expand(-1, 3).float() * 0.5)
    assert torch.equal(td["next", "reward"], -ids.float())


# --- pure functions (no Ray) -------------------------------------------------------------------
def test_split_index_inverts_the_encoding() -> None:
    k = 3
    shard = np.array([0, 1, 2, 2, 0])
    local = np.array([0, 0, 5, 7, 9])
    s, loc = split_index(local * k + shard, k)
    assert s.tolist() == shard.tolist() and loc.tolist() == local.tolist()
    with pytest.raises(ValueError, match="index"):
        split_index([-1], k)


def test_global_weights_match_a_single_buffer_formula() -> None:
    rng = np.random.default_rng(0)
    values = [rng.random(5) + 0.1, rng.random(7) + 0.1]
    total = np.array([v.sum() for v in values])
    vmin = np.array([v.min() for v in values])
    share = total / total.sum()
    shard = np.array([0, 0, 1, 1, 1])
    local = np.array([1, 4, 0, 6, 3])
    picked = np.array([values[s][i] for s, i in zip(shard, local, strict=True)])
    beta = 0.7
    got = global_weights(picked, shard, share, total, vmin, beta)
    allv = np.concatenate(values)
    expected = (picked / allv.min()) ** -beta  # one buffer holding every item
    np.testing.assert_allclose(got, expected, rtol=1e-12)


def test_missing_ray_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    monkeypatch.setattr(distributed._shard, "_ACTOR_CLASS", None)
    with pytest.raises(MissingExtraError, match=r"pip install 'rbdata\[ray\]'"):
        RayReplayBuffer(TensorStorage(10))


# --- on Ray ---------------------------------------------------------------------------------
@ray.remote
def collect(rb: RayReplayBuffer, worker: int, rounds: int, per: int) -> list[tuple[int, int]]:
    """Extend ``rounds`` batches; return (id, global index) of every item written."""
    written = []
    for r in range(rounds):
        ids = worker * 100_000 + r * per + np.arange(per)
        index = rb.extend(batch(ids))
        written += list(zip(ids.tolist(), index.tolist(), strict=True))
        time.sleep(0.01)
    return written


def test_collectors_and_a_prioritized_learner(ray_local: None) -> None:
    rounds, per = 6, 25
    rb = RayReplayBuffer(
        TensorStorage(200),
        PrioritizedSampler(200, alpha=1.0, beta=0.5),
        batch_size=32,
        num_shards=2,
    )
    tasks = [collect.remote(rb, w, rounds, per) for w in range(2)]
    seen: set[int] = set()
    pending = list(tasks)
    while pending:
        _, pending = ray.wait(pending, timeout=0.02)
        if len(rb) == 0:
            continue
        td = rb.sample()
        check_rows(td)
        seen.update(td["id"].tolist())
        rb.update_priority(td["index"], td["id"].float() % 7 + 0.5)
    written = [pair for task in ray.get(tasks) for pair in task]
    # independent expectation: exactly the ids the collectors made, each once
    expected = {w * 100_000 + i for w in range(2) for i in range(rounds * per)}
    assert sorted(i for i, _ in written) == sorted(expected)
    assert len({g for _, g in written}) == len(written)  # no slot written twice
    assert len(rb) == len(expected)
    assert seen <= expected and seen  # the learner saw items written by the collectors
    # every sampled index holds the item written there
    id_at = dict((g, i) for i, g in written)
    td = rb.sample(512)
    check_rows(td)
    assert all(id_at[g] == i for g, i in zip(td["index"].tolist(), td["id"].tolist(), strict=True))
    # priorities route back to the owning shard: only one item left with mass
    everything = torch.tensor(sorted(id_at))
    rb.update_priority(everything, torch.zeros(len(everything)))
    target = int(everything[37])
    rb.update_priority([target], [3.0])
    td = rb.sample(64)
    assert set(td["index"].tolist()) == {target}
    # zero priorities keep eps = 1e-8 of mass: the global min value is eps (as locally)
    torch.testing.assert_close(td["weight"], torch.full((64,), (3.0 / 1e-8) ** -0.5))


@pytest.mark.slow
def test_uniform_samples_follow_shard_sizes(ray_local: None) -> None:
    rb = RayReplayBuffer(TensorStorage(1000), UniformSampler(), num_shards=2)
    rb.extend(batch(np.arange(300)))  # shard 0
    rb.extend(batch(np.arange(300, 400)))  # shard 1
    assert len(rb) == 400
    n = 8000
    index = torch.cat([rb.sample(1000)["index"] for _ in range(n // 1000)])
    frac = float((index % 2 == 0).float().mean())
    assert abs(frac - 0.75) < 5 * (0.75 * 0.25 / n) ** 0.5


@pytest.mark.slow
def test_prioritized_proportions_weights_and_errors(ray_local: None) -> None:
    beta = 0.6
    rb = RayReplayBuffer(
        TensorStorage(16), PrioritizedSampler(16, alpha=1.0, beta=beta, eps=0.0), num_shards=2
    )
    g0 = rb.extend(batch(np.arange(4)))
    g1 = rb.extend(batch(np.arange(4, 8)))
    assert g0.tolist() == [0, 2, 4, 6] and g1.tolist() == [1, 3, 5, 7]
    prio = {0: 1.0, 2: 2.0, 4: 3.0, 6: 4.0, 1: 5.0, 3: 6.0, 5: 7.0, 7: 8.0}
    rb.update_priority(list(prio), list(prio.values()))
    td = rb.sample(20_000)
    counts = np.bincount(td["index"].numpy(), minlength=8)
    p = np.array([prio[i] for i in range(8)])
    np.testing.assert_allclose(counts / counts.sum(), p / p.sum(), atol=0.01)
    expected = (p[td["index"].numpy()] / p.min()) ** -beta
    np.testing.assert_allclose(td["weight"].numpy(), expected, rtol=1e-5)
    # refusals: bad priorities change nothing anywhere; an index past its shard names it
    with pytest.raises(ValueError, match="priority"):
        rb.update_priority([0, 1], [1.0, float("nan")])
    with pytest.raises(ValueError, match="index: 9 "):
        rb.update_priority([9], [1.0])
    td = rb.sample(2000)
    np.testing.assert_allclose(
        td["weight"].numpy(), (p[td["index"].numpy()] / p.min()) ** -beta, rtol=1e-5
    )


@pytest.mark.slow
def test_dumps_loads_round_trip(ray_local: None, tmp_path) -> None:  # type: ignore[no-untyped-def]
    rb = RayReplayBuffer(
        lambda: MemmapStorage(64),
        PrioritizedSampler(64, alpha=1.0, beta=1.0),
        RoundRobinWriter(),
        batch_size=16,
        num_shards=2,
    )
    index = torch.cat([rb.extend(batch(np.arange(i * 10, i * 10 + 10))) for i in range(3)])
    rb.update_priority(index, torch.arange(30, dtype=torch.float64) + 1)
    rb.dumps(tmp_path / "ckpt")
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["shard-0", "shard-1"]
    back = RayReplayBuffer.loads(tmp_path / "ckpt")
    assert back.num_shards == 2 and len(back) == 30 and back.batch_size == 16
    id_at = dict(zip(index.tolist(), range(30), strict=True))
    td = back.sample(256)
    check_rows(td)
    assert all(id_at[g] == i for g, i in zip(td["index"].tolist(), td["id"].tolist(), strict=True))
    expected = ((torch.tensor([id_at[g] for g in td["index"].tolist()]) + 1.0) / 1.0) ** -1.0
    torch.testing.assert_close(td["weight"], expected.float(), rtol=1e-5, atol=0)
    # a new handle starts on shard 0, whose writer continues at its slot 20
    assert back.extend(batch(np.arange(100, 102))).tolist() == [40, 42]
    # on a buffer, loads loads in place (torchrl's spelling), as ReplayBuffer's does
    rb.empty()
    assert rb.loads(tmp_path / "ckpt") is rb and len(rb) == 30
    td = rb.sample(64)
    assert all(id_at[g] == i for g, i in zip(td["index"].tolist(), td["id"].tolist(), strict=True))
    with pytest.raises(ValueError, match="num_shards"):
        rb.loads(tmp_path / "ckpt", num_shards=3)
    rb.close()
    back.close()


@ray.remote
class Learner:
    def __init__(self, rb: RayReplayBuffer) -> None:
        self.rb = rb

    def step(self) -> list[int]:
        td = self.rb.sample(8)
        self.rb.update_priority(td["index"], torch.full((8,), 2.0))
        return td["id"].tolist()


@pytest.mark.slow
def test_handle_in_an_actor_and_templates(ray_local: None) -> None:
    with pytest.raises(ValueError, match="template must be empty"):
        filled = TensorStorage(8)
        filled.set(slice(0, 2), torch.zeros(2, 3))
        RayReplayBuffer(filled)
    with pytest.raises(TypeError, match="storage"):
        RayReplayBuffer(object())  # type: ignore[arg-type]
    rb = RayReplayBuffer(TensorStorage(32), PrioritizedSampler(32, 0.6, 0.4), batch_size=4)
    rb.extend(batch(np.arange(10)))
    learner = Learner.remote(rb)
    ids = ray.get(learner.step.remote())
    assert set(ids) <= set(range(10))
    assert rb.add(batch(np.array([10]))[0]) == 10
    assert len(rb) == 11
