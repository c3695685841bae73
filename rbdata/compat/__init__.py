"""Drop-in replacements for other libraries' buffer APIs, backed by rbdata storages.

- :mod:`rbdata.compat.sb3`: Stable-Baselines3's ``ReplayBuffer`` (and CleanRL code using
  it), plus a prioritized variant and checkpoints.
"""

from rbdata.compat import sb3

__all__ = ["sb3"]
