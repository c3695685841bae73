"""Writers: where incoming data goes."""

from rbdata.writers.base import Writer
from rbdata.writers.immutable import ImmutableWriter
from rbdata.writers.max_value import MaxValueWriter
from rbdata.writers.round_robin import RoundRobinWriter

__all__ = ["ImmutableWriter", "MaxValueWriter", "RoundRobinWriter", "Writer"]
