"""One heartbeat's load figures, as the hotness windows take them (issue 19).

`Sample` and `busy_score` are the vocabulary the hotness windows (hotness.py) import:
every figure a 0..1 fraction, so that a partition's
hotness compares CPU, run queue, pressure and GPU on one scale. `sample_from_state`
builds one from an agent's NodeState; it is pure, and a node that reports no PSI or has
no GPUs gives None for those (unknown, not idle), so busy_score takes the max of what
is known.
"""

from __future__ import annotations

from dataclasses import dataclass

from mesh.schema import NodeState

__all__ = ["Sample", "busy_score", "sample_from_state"]


@dataclass(frozen=True, slots=True)
class Sample:
    """One heartbeat's load figures, all 0..1 fractions unless said."""

    ts: float
    cpu_busy: float  # cpu_percent / 100
    load_per_core: float  # load1 / cores (may exceed 1)
    mem_used: float  # memory_used / memory capacity
    cpu_pressure: float | None = None  # PSI some avg10 / 100, None if the kernel has none
    mem_pressure: float | None = None
    gpu_util: float | None = None  # mean GPU utilization / 100, None without GPUs


def _unit(x: float | None) -> float:
    """A signal clipped to 0..1; a missing or NaN one counts as 0 (it says nothing)."""
    if x is None or not x > 0.0:  # (NaN fails every comparison)
        return 0.0
    return 1.0 if x > 1.0 else float(x)


def busy_score(s: Sample) -> float:
    """How busy a node is, 0..1: the max of its signals, each clipped to 0..1.

    The max, not a mean, because any one resource running out is enough to hurt the
    services on the node: a node at 20 % CPU but 40 % memory stall time is not idle."""
    return max(
        _unit(s.cpu_busy),
        _unit(s.load_per_core),
        _unit(s.mem_used),
        _unit(s.cpu_pressure),
        _unit(s.mem_pressure),
        _unit(s.gpu_util),
    )


def _fraction(x: float) -> float:
    return min(max(x, 0.0), 1.0)


def sample_from_state(state: NodeState, now: float) -> Sample:
    """The Sample of one heartbeat, stamped `now` (the receiver's clock: an agent's
    clock may be off, and staleness is judged by the coordinator's). A node that
    declares no cores or no memory reads 0 for what it cannot be divided by."""
    cores = state.capacity.cpu / 1000.0
    memory = state.capacity.memory
    gpus = state.gpus
    return Sample(
        ts=now,
        cpu_busy=_fraction(state.cpu_percent / 100.0),
        load_per_core=max(0.0, state.load1 / cores) if cores > 0 else 0.0,
        mem_used=_fraction(state.memory_used / memory) if memory > 0 else 0.0,
        cpu_pressure=None if state.cpu_pressure is None else _fraction(state.cpu_pressure / 100),
        mem_pressure=None if state.mem_pressure is None else _fraction(state.mem_pressure / 100),
        gpu_util=(
            _fraction(sum(g.utilization for g in gpus) / (100.0 * len(gpus))) if gpus else None
        ),
    )
