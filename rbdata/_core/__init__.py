"""rbdata's core: what every package may use, and which uses nothing else of rbdata.

The tensor layout of items (:mod:`~rbdata._core.layout`), file safety (``files``: no
symlinks, atomic writes; ``ids``: directory ids; ``atomic``: the ``CURRENT``-switched
directories; ``checked``: fields read from files), checksums, the processes holding a
directory (``holders``), index arithmetic, the numba pointer helpers (``native``), devices,
packaged resources, and the wording of messages (``shown``, ``torchrl_names``). The modules
import only each other and :mod:`rbdata.errors`; every other package may import them
(``tests/test_layering.py``).
"""
