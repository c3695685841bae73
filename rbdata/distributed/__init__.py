"""``RayReplayBuffer``: replay buffers owned by Ray actors, sharded across machines.

Each shard is a Ray actor holding an ordinary :class:`~rbdata.ReplayBuffer`; the handle
(:class:`RayReplayBuffer`) is picklable, so collector tasks and learner actors all use the same
buffer. Batches travel through Ray's object store as numpy arrays (a TensorDict is flattened to
its leaves and its batch size, and rebuilt on the other side), never as pickled TensorDicts.

Global indices encode the shard: ``global = local * num_shards + shard`` (with one shard, the
global index is the local slot). :func:`split_index` decodes them.

``ray`` is imported only when a :class:`RayReplayBuffer` is built; without it the constructor
raises :class:`~rbdata.errors.MissingExtraError` with ``pip install 'rbdata[ray]'``.
"""

from rbdata.distributed._handle import RayReplayBuffer
from rbdata.distributed._weights import global_weights, split_index

__all__ = ["RayReplayBuffer", "global_weights", "split_index"]
