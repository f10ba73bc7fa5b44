"""The vocabulary shared by the router core, the baselines and the simulator.

Inputs (``Request``, ``Gpu``, ``ModelSpec``) and outputs (``Dispatch``, ``Drop``) are
frozen dataclasses; every scheduling policy speaks the same ``Policy`` protocol so the
simulator can run all of them on identical inputs, and the I/O shell that will sit on
NATS can drive ours without knowing how it decides.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol

from inference.profile import LatencyProfile

DEFAULT_GPU_TYPE = "gpu"


@dataclass(frozen=True, slots=True)
class Request:
    """One inference request: which model, when it arrived, when its answer is due.

    ``deadline_ns`` is absolute (arrival + the model's SLO, less any response-path
    latency the caller wants to reserve). The core never reads a clock: these times
    are all it knows about the request.
    """

    id: int
    model: str
    arrival_ns: int
    deadline_ns: int


@dataclass(frozen=True, slots=True)
class Gpu:
    """A GPU the router may dispatch to: its id, when it is next free, its type.

    ``gpu_type`` selects the model's latency profile, so one router can drive a mix
    of, say, V100s and A100s.
    """

    id: str
    free_at_ns: int = 0
    gpu_type: str = DEFAULT_GPU_TYPE


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """A model the router serves: its SLO and its latency profile per GPU type."""

    name: str
    slo_ns: int
    profiles: Mapping[str, LatencyProfile] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.slo_ns <= 0:
            raise ValueError(f"model {self.name!r}: slo_ns must be > 0")
        if not self.profiles:
            raise ValueError(f"model {self.name!r}: needs a latency profile")

    @classmethod
    def single(cls, name: str, slo_ns: int, profile: LatencyProfile,
               gpu_type: str = DEFAULT_GPU_TYPE) -> ModelSpec:
        """A model with one profile, for a pool of one GPU type."""
        return cls(name=name, slo_ns=slo_ns, profiles={gpu_type: profile})

    def profile_for(self, gpu_type: str) -> LatencyProfile:
        try:
            return self.profiles[gpu_type]
        except KeyError:
            raise ValueError(
                f"model {self.name!r} has no profile for GPU type {gpu_type!r}") from None


class DropReason(StrEnum):
    """Why a request was answered with an error instead of a result.

    Every reason says "deadline cannot be met": a request is dropped only when
    serving it would make it (or, for ``AT_TARGET_BATCH``, the batch it must join)
    miss a deadline. The router never serves a request late.
    """

    DEADLINE_CANNOT_BE_MET = "deadline cannot be met"
    """Even alone, on the GPU that frees first, it would finish after its deadline."""

    AT_TARGET_BATCH = "deadline cannot be met at the target batch size"
    """It could only be served by shrinking its batch below the size the measured
    arrival rate calls for, which would cost more capacity than the request is worth
    (Symphony's window drop)."""

    EXPIRED = "deadline passed before dispatch"
    """Lazy drop by a baseline: the deadline had already passed when a GPU came free."""


@dataclass(frozen=True, slots=True)
class Dispatch:
    """Run ``request_ids`` of ``model`` as one batch on ``gpu_id`` from start to end."""

    gpu_id: str
    model: str
    request_ids: tuple[int, ...]
    start_ns: int
    end_ns: int


@dataclass(frozen=True, slots=True)
class Drop:
    """Answer ``request_id`` with an error now; it will not be served."""

    request_id: int
    reason: DropReason

    @property
    def message(self) -> str:
        return self.reason.value


Decision = Dispatch | Drop


class Policy(Protocol):
    """What the simulator (and later the NATS shell) drives.

    The caller hands over each arriving request with ``submit`` and calls ``step`` at
    every arrival and at ``next_wakeup_ns``; ``step`` returns what to do now. A policy
    owns its view of GPU free times: batch latencies are deterministic, so the end of
    every batch it dispatched is known when it dispatches it.
    """

    name: str

    def submit(self, request: Request, now_ns: int) -> None: ...

    def step(self, now_ns: int) -> list[Decision]: ...

    def next_wakeup_ns(self) -> int | None: ...
