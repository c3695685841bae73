"""The prioritized sampler's tree backends: one protocol, a CPU and a device implementation.

- :mod:`~rbdata.samplers._trees.backend`: the :class:`TreeBackend` protocol, :class:`TreeSpec`,
  the one validation and its messages;
- :mod:`~rbdata.samplers._trees.sumtree`: the 8-ary sum and block-min trees as pure functions
  over tensors (the torch reference, the checks, the dispatch to numba on CPU tensors);
- :mod:`~rbdata.samplers._trees.numba_kernels`: their numba kernels (update, find, draw, set
  priorities);
- :mod:`~rbdata.samplers._trees.cpu`: :class:`CpuTrees`, CPU trees walked by numba;
- :mod:`~rbdata.samplers._trees.device`: :class:`DeviceTrees`, trees on any device walked by
  the fused Triton kernels (:mod:`~rbdata.samplers._trees.triton_ops`,
  :mod:`~rbdata.samplers._trees.triton_kernels`) or the batched torch reference
  (:mod:`~rbdata.samplers._trees.torch_ops`), without a host wait.
"""

__all__: list[str] = []  # import the modules themselves (no cycles through the package)
