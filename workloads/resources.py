"""A vector of resource amounts, in exact integer units.

One type serves for a task's request, a node's capacity, a pool's reservation and an
entitlement, so that the scheduler's arithmetic (sums, differences, fits) is written once.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import ClassVar

from workloads.quantity import SpecError, format_bytes, format_cpu, format_gpu

__all__ = ["NOTHING", "Resources", "gpu_share"]

_MAX_AMOUNT = 2**63 - 1  # every amount must survive a signed 64-bit wire encoding


@dataclass(frozen=True, slots=True)
class Resources:
    """Amounts of each resource kind.

    Units are fixed so that all arithmetic is on integers: ``cpu`` in millicores,
    ``memory``/``disk``/``gpu_memory`` in bytes, ``gpu`` in milli-GPUs (1000 is one whole
    GPU, 250 a quarter of one). ``gpu_memory`` is the total over the GPUs asked for.
    Amounts may be negative as the result of ``-`` (e.g. an overdrawn pool); nothing here
    clamps them, so callers can see by how much.
    """

    cpu: int = 0
    memory: int = 0
    disk: int = 0
    gpu: int = 0
    gpu_memory: int = 0

    KINDS: ClassVar[tuple[str, ...]] = ("cpu", "memory", "disk", "gpu", "gpu_memory")

    def _amounts(self) -> tuple[int, ...]:
        return (self.cpu, self.memory, self.disk, self.gpu, self.gpu_memory)

    def __add__(self, other: object) -> Resources:
        if not isinstance(other, Resources):
            return NotImplemented
        # Spelled out: this sits in the scheduler's inner loops.
        return Resources(
            self.cpu + other.cpu,
            self.memory + other.memory,
            self.disk + other.disk,
            self.gpu + other.gpu,
            self.gpu_memory + other.gpu_memory,
        )

    def __sub__(self, other: object) -> Resources:
        if not isinstance(other, Resources):
            return NotImplemented
        return Resources(
            self.cpu - other.cpu,
            self.memory - other.memory,
            self.disk - other.disk,
            self.gpu - other.gpu,
            self.gpu_memory - other.gpu_memory,
        )

    @staticmethod
    def total(items: Iterable[Resources], start: Resources | None = None) -> Resources:
        """The sum of `items` (and `start`): one new object, where `sum()` builds one per
        item (admission summed thousands of jobs a round that way)."""
        cpu = memory = disk = gpu = gpu_memory = 0
        for r in items if start is None else (start, *items):
            cpu += r.cpu
            memory += r.memory
            disk += r.disk
            gpu += r.gpu
            gpu_memory += r.gpu_memory
        return Resources(cpu, memory, disk, gpu, gpu_memory)

    def scaled(self, n: int) -> Resources:
        """This amount ``n`` times over (a task group's request times its count)."""
        return Resources(*(a * n for a in self._amounts()))

    def fits_in(self, capacity: Resources) -> bool:
        """True when every kind is at most ``capacity``'s."""
        return all(a <= c for a, c in zip(self._amounts(), capacity._amounts(), strict=True))

    def shortfall(self, capacity: Resources) -> tuple[str, ...]:
        """The kinds, in ``KINDS`` order, where this exceeds ``capacity``: the reason a
        placement failed, as a user should be told it."""
        return tuple(
            kind
            for kind, a, c in zip(self.KINDS, self._amounts(), capacity._amounts(), strict=True)
            if a > c
        )

    def is_zero(self) -> bool:
        return not any(self._amounts())

    def to_dict(self) -> dict[str, int]:
        """Every kind, in its integer unit (millicores, bytes, milli-GPUs)."""
        return dict(zip(self.KINDS, self._amounts(), strict=True))

    @classmethod
    def from_dict(cls, d: Mapping[str, object]) -> Resources:
        """The inverse of :meth:`to_dict`, for data that crossed a boundary: missing kinds are
        0; unknown kinds, non-integers and negative amounts are a :class:`SpecError`."""
        if not isinstance(d, Mapping):
            raise SpecError("", f"resources must be a mapping, got {type(d).__name__}")
        unknown = sorted(str(k) for k in d if k not in cls.KINDS)
        if unknown:
            raise SpecError(unknown[0], f"unknown resource kind (known: {', '.join(cls.KINDS)})")
        amounts: dict[str, int] = {}
        for kind, value in d.items():
            if isinstance(value, bool) or not isinstance(value, int):
                raise SpecError(kind, f"expected an integer, got {type(value).__name__}")
            if not 0 <= value <= _MAX_AMOUNT:
                raise SpecError(kind, f"must be between 0 and 2**63-1, got {value}")
            amounts[kind] = value
        return cls(**amounts)

    def __str__(self) -> str:
        """``cpu=500m memory=64Mi gpu=0.25 gpu_memory=10Gi``; zero kinds left out."""
        formats = (format_cpu, format_bytes, format_bytes, format_gpu, format_bytes)
        parts = [
            f"{kind}={fmt(amount)}"
            for kind, fmt, amount in zip(self.KINDS, formats, self._amounts(), strict=True)
            if amount
        ]
        return " ".join(parts) if parts else "none"


NOTHING = Resources()  # shared: a sum's start or a missing entry, without an init each


def gpu_share(gpu: int, gpu_memory: int, gpus: int) -> tuple[int, int]:
    """What each of the `gpus` GPUs a task was granted holds of it: (milli-GPUs, bytes).
    A fraction sits on one GPU whole; whole GPUs split the memory evenly (rounded down).
    The one rule the fold's accounting, placement and the agent's enforcement share."""
    n = max(gpus, 1)
    return (gpu if n == 1 else gpu // n), gpu_memory // n
