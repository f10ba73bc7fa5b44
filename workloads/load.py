"""Simulated CPU load: how busy a hollow node's task is over time, as a pure curve.

A hollow (simulated) node runs nothing, so without this its reported busy never moves and
hotness, partition moves and load-aware placement cannot be tested at scale. A task's
``simulate.load`` says how many cores it keeps busy at each moment; the node reports the
sum over its tasks (``agent.hollow``). Everything here is pure and deterministic: the
same curve, time and seed give the same load, so a benchmark's runs are repeatable.

Time on a curve is ``t - origin`` seconds, ``t`` being the caller's clock (a hollow node
passes the heartbeat's Unix time). With the default ``origin`` 0 every replica of a
service, wherever and whenever it started, is at the same point of its curve, as the
replicas of one real service share one demand; a benchmark that wants its curve to start
at its own start sets ``origin`` to that Unix time.

The curves, as the fraction of ``cores`` busy (a *level*, 0..1):

- ``flat``: ``peak`` at all times.
- ``diurnal``: ``trough + (peak - trough) * (1 + sin(2 pi (t + phase) / period)) / 2``,
  between trough and peak, at the mean and rising at ``t = -phase``.
- ``step``: ``trough`` until ``step_at``, then ``step_to`` (default: ``peak``).

``noise`` is the amplitude of a uniform jitter, as a fraction of ``cores``: the node adds
``jitter(seed, second) * noise * cores`` (see :func:`jitter`), never going below 0.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from workloads.quantity import SpecError, _show, parse_duration

__all__ = [
    "CURVES",
    "LOAD_FIELDS",
    "MAX_LOAD_CORES",
    "LoadCurve",
    "check_load",
    "jitter",
    "level_at",
    "load_at",
    "load_to_dict",
    "parse_load",
]

CURVES = ("flat", "diurnal", "step")
# The spec's field names (YAML), and the dataclass field each is kept in.
LOAD_FIELDS = {
    "curve": "curve",
    "peak": "peak",
    "trough": "trough",
    "period": "period_s",
    "phase": "phase_s",
    "cores": "cores",
    "noise": "noise",
    "step_at": "step_at_s",
    "step_to": "step_to",
    "origin": "origin",
}
_SPEC_NAME = {attr: name for name, attr in LOAD_FIELDS.items()}
# Fields that mean something for some curves only: given for another, they are an error
# (nearly always a curve changed and a field left behind), not silently ignored.
_ONLY_FOR = {
    "trough": ("diurnal", "step"),
    "period": ("diurnal",),
    "phase": ("diurnal",),
    "step_at": ("step",),
    "step_to": ("step",),
}
MAX_LOAD_CORES = 4096.0  # a task's `cores`: more than any node has
MAX_ORIGIN = 2**40  # seconds: any Unix time of this era, with room
DAY_S = 86400.0
_PEAK = 1.0  # the default peak, and a step curve's default step_to


@dataclass(frozen=True, slots=True)
class LoadCurve:
    """A task's simulated CPU use over time; build it with :func:`parse_load` (or check a
    hand-built one with :func:`check_load`). Levels are fractions of ``cores``;
    ``cores`` None means the task's cpu request (filled in by whoever runs it)."""

    curve: str = "flat"
    peak: float = _PEAK
    trough: float = 0.0
    period_s: float = DAY_S
    phase_s: float = 0.0
    cores: float | None = None
    noise: float = 0.0
    step_at_s: float = 0.0
    step_to: float = 1.0
    origin: float = 0.0


def level_at(load: LoadCurve, t: float) -> float:
    """The fraction of ``cores`` busy at time ``t`` (no noise), in [0, 1]."""
    kind = load.curve
    if kind == "flat":
        return load.peak
    x = t - load.origin
    if kind == "diurnal":
        wave = math.sin(2.0 * math.pi * (x + load.phase_s) / load.period_s)
        return load.trough + (load.peak - load.trough) * (1.0 + wave) / 2.0
    return load.trough if x < load.step_at_s else load.step_to


def load_at(load: LoadCurve, t: float, request_cores: float = 1.0) -> float:
    """Cores in use at time ``t`` (no noise): the level times ``cores``, or times
    ``request_cores`` (the task's cpu request) for a curve without its own ``cores``."""
    cores = request_cores if load.cores is None else load.cores
    return level_at(load, t) * cores


_M64 = (1 << 64) - 1


def jitter(seed: int, step: int) -> float:
    """A deterministic draw in [-1, 1) for (seed, step): splitmix64 of the pair.

    A pure function of its inputs rather than a random.Random per node, so 5,000 nodes
    keep no generator state (2.5 KB each) and a node's noise at a given second is the same
    in every run, whatever order its heartbeats went out in."""
    x = (seed * 0x9E3779B97F4A7C15 + step * 0xD1B54A32D192ED03) & _M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    x ^= x >> 31
    return x / 2.0**63 - 1.0


# --------------------------------------------------------------------------- checking


def check_load(load: LoadCurve) -> LoadCurve:
    """``load`` if every value is in range; else a SpecError naming the dataclass field.

    The one set of rules for both a spec (:func:`parse_load` renames the field to the
    spec's) and the wire (mesh.schema decodes a TaskSpec's load with it)."""
    if load.curve not in CURVES:
        raise SpecError("curve", f"expected one of {', '.join(CURVES)}, got {_show(load.curve)}")
    for attr in ("peak", "trough", "step_to", "noise"):
        _in_range(getattr(load, attr), attr, 0.0, 1.0)
    if load.cores is not None:
        _in_range(load.cores, "cores", 0.0, MAX_LOAD_CORES)
    _in_range(load.period_s, "period_s", 0.0, 366 * DAY_S)
    if load.period_s <= 0.0:
        raise SpecError("period_s", "must be more than 0")
    _in_range(load.phase_s, "phase_s", 0.0, 366 * DAY_S)
    _in_range(load.step_at_s, "step_at_s", 0.0, 366 * DAY_S)
    _in_range(load.origin, "origin", 0.0, float(MAX_ORIGIN))
    if load.curve != "flat" and load.peak < load.trough:
        raise SpecError("peak", f"must not be below trough ({load.trough:g}), got {load.peak:g}")
    return load


def _in_range(value: Any, attr: str, low: float, high: float) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise SpecError(attr, f"expected a number, got {_show(value)}")
    if not math.isfinite(value) or not low <= value <= high:
        raise SpecError(attr, f"must be between {low:g} and {high:g}, got {_show(value)}")


# --------------------------------------------------------------------------- spec form


def parse_load(value: object, path: str) -> LoadCurve:
    """A task group's ``simulate.load`` mapping, validated field by field: unknown fields,
    fields of another curve, bad numbers and ``peak`` below ``trough`` are SpecErrors
    naming the field (``tasks[0].simulate.load.peak``). Durations (``period``, ``phase``,
    ``step_at``) take the spec's forms (``600s``, ``10m``, a number of seconds)."""
    if not isinstance(value, Mapping):
        raise SpecError(path, f"expected a mapping, got {_show(value)}")
    given: dict[str, Any] = {}
    for key, item in value.items():
        if key not in LOAD_FIELDS:
            name = key[:64] if isinstance(key, str) else _show(key)
            raise SpecError(f"{path}.{name}", f"unknown field (known: {', '.join(LOAD_FIELDS)})")
        if item is not None:
            given[key] = item
    curve = given.get("curve", "flat")
    if curve not in CURVES:
        raise SpecError(f"{path}.curve", f"expected one of {', '.join(CURVES)}, got {_show(curve)}")
    for key in given:
        if key in _ONLY_FOR and curve not in _ONLY_FOR[key]:
            only = " and ".join(_ONLY_FOR[key])
            raise SpecError(f"{path}.{key}", f"applies only to a {only} curve, not {curve}")
    if curve == "step" and "step_at" not in given:
        raise SpecError(f"{path}.step_at", "required for a step curve (when the step comes)")
    kwargs: dict[str, Any] = {"curve": curve}
    for key, item in given.items():
        if key == "curve":
            continue
        field = f"{path}.{key}"
        if key in ("period", "phase", "step_at"):
            kwargs[LOAD_FIELDS[key]] = parse_duration(item, field)
        elif isinstance(item, bool) or not isinstance(item, int | float):
            raise SpecError(field, f"expected a number, got {_show(item)}")
        else:
            kwargs[LOAD_FIELDS[key]] = float(item)
    kwargs.setdefault("step_to", kwargs.get("peak", _PEAK))
    try:
        return check_load(LoadCurve(**kwargs))
    except SpecError as exc:
        raise SpecError(f"{path}.{_SPEC_NAME.get(exc.field, exc.field)}", exc.problem) from None


def load_to_dict(load: LoadCurve) -> dict[str, Any]:
    """The spec form of a curve, only the fields its curve takes (so that
    ``parse_load(load_to_dict(x), p) == x``); durations as float seconds."""
    out: dict[str, Any] = {"curve": load.curve, "peak": load.peak}
    if load.curve in _ONLY_FOR["trough"]:
        out["trough"] = load.trough
    if load.curve == "diurnal":
        out["period"] = load.period_s
        out["phase"] = load.phase_s
    if load.curve == "step":
        out["step_at"] = load.step_at_s
        out["step_to"] = load.step_to
    if load.cores is not None:
        out["cores"] = load.cores
    out["noise"] = load.noise
    out["origin"] = load.origin
    return out
