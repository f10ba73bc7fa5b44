"""The partition controller's configuration: which partitions exist and how eagerly nodes move.

Defaults are anchored on what others run (README.md beside this file names each anchor),
and every field is checked here, once, so the controller never sees a dead band turned
inside out (cold above hot) or a rate limit of zero. Errors are
:class:`workloads.quantity.SpecError` naming the field, because
`mesh partition apply FILE` shows them verbatim to the person who wrote the file.

YAML keys are the field names of :class:`PartitionsConfig`, every one optional; durations
(the ``_s`` fields) are seconds or written as in job specs: ``10s``, ``5m``, ``1h30m``::

    partitions:                 # name -> settings; stateless and batch must both be there
      stateless: {min_nodes: 2}
      batch: {oversubscribe: 1.5}
      batch/critical: {protected: true}   # virtual: parent/child, never lent
    default_partition: batch
    interval_s: 10s
    window_s: 5m
    stale_after_s: 30s
    busy_line: 0.7
    hot_fraction: 0.6
    cold_fraction: 0.4
    spike_fraction: 0.9
    borrow_after_s: 20s
    return_after_s: 10m
    cooldown_s: 5m
    nodes_per_move: 10
    moves_per_hour: 120
    max_draining: 20
    max_draining_per_zone: 10
    forecast: true
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import yaml

from workloads.quantity import SpecError, _show, parse_duration

# The job-spec loader: a SafeLoader that rejects duplicate keys (a partition named twice),
# as coordinator/pools/tree.py uses it.
from workloads.spec import _UNREADABLE, _unreadable
from workloads.spec import _Loader as _SpecLoader

__all__ = [
    "BATCH",
    "MAX_SOURCE_BYTES",
    "STATELESS",
    "PartitionSpec",
    "PartitionsConfig",
    "parse_partitions_config",
]

STATELESS, BATCH = "stateless", "batch"

MAX_SOURCE_BYTES = 64 << 10  # a controller config is a few hundred bytes
MAX_PARTITIONS = 64
MAX_COUNT = 1_000_000  # largest node count or rate a config may name: far above any region
MAX_OVERSUBSCRIBE = 100.0
MAX_DURATION_S = 7 * 86400.0  # a week: a longer wait is a typo, not a policy

_SEGMENT_RE = re.compile(r"[a-z0-9_-]{1,32}")  # the rule of pool path segments
_PARTITION_FIELDS = ("min_nodes", "oversubscribe", "protected")


class _Loader(_SpecLoader):  # type: ignore[misc, valid-type]
    max_nodes = 10_000  # a config this size has no business having more values


@dataclass(frozen=True, slots=True)
class PartitionSpec:
    """One partition: ``stateless``, ``batch``, or a virtual ``parent/child`` inside one."""

    name: str
    min_nodes: int = 0
    oversubscribe: float = 1.0  # allocatable = oversubscribe x capacity (>= 1.0)
    protected: bool = False  # virtual partitions only: its nodes are never lent (nor break-glassed)

    @property
    def parent(self) -> str:
        """The partition a virtual one lies inside; "" for a top-level one."""
        return self.name.split("/", 1)[0] if "/" in self.name else ""


# Durations: seconds as numbers, or as job specs write them ("10s", "5m", "1h30m").
_DURATIONS = (
    "interval_s",
    "window_s",
    "stale_after_s",
    "borrow_after_s",
    "return_after_s",
    "cooldown_s",
)
_FRACTIONS = ("busy_line", "hot_fraction", "cold_fraction", "spike_fraction")
_COUNTS = ("nodes_per_move", "moves_per_hour", "max_draining", "max_draining_per_zone")
_TOP_FIELDS = ("partitions", "default_partition", *_DURATIONS, *_FRACTIONS, *_COUNTS, "forecast")


@dataclass(frozen=True, slots=True)
class PartitionsConfig:
    """The controller's settings. Constructing one checks it (:class:`SpecError`), so a
    config built in code is held to the same rules as one read from YAML."""

    partitions: tuple[PartitionSpec, ...] = (PartitionSpec(STATELESS), PartitionSpec(BATCH))
    default_partition: str = BATCH  # where a node with no partition label/record starts
    interval_s: float = 10.0  # controller interval
    window_s: float = 300.0  # hotness window kept per node
    stale_after_s: float = 30.0  # a node whose last sample is older is "unknown"
    busy_line: float = 0.7  # a node is hot when its busy p90 over the window is above it
    hot_fraction: float = 0.6  # a partition is hot when > 60 % of its known nodes are hot
    cold_fraction: float = 0.4  # cold when < 40 %; between: dead band, no move
    spike_fraction: float = 0.9  # more hot: borrow at once, no dwell or rate limits (1: never)
    borrow_after_s: float = 20.0  # hot this long (consecutive intervals) before borrowing
    return_after_s: float = 600.0  # cold this long before returning borrowed nodes
    cooldown_s: float = 300.0  # a node moved is not moved again for this long
    nodes_per_move: int = 10
    moves_per_hour: int = 120  # nodes moved per hour, all partitions
    max_draining: int = 20  # nodes draining at once
    max_draining_per_zone: int = 10
    forecast: bool = True  # borrow when the trend says the partition will be hot next interval

    def __post_init__(self) -> None:
        _check(self)

    def spec(self, name: str) -> PartitionSpec | None:
        """The named partition's settings, or None when it is not configured."""
        for p in self.partitions:
            if p.name == name:
                return p
        return None

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.partitions)

    def lenders(self) -> tuple[str, ...]:
        """The partitions the controller may borrow nodes from: ``batch`` and its virtual
        partitions that are not protected."""
        return tuple(
            p.name
            for p in self.partitions
            if p.name == BATCH or (p.parent == BATCH and not p.protected)
        )


def _check(cfg: PartitionsConfig) -> None:
    """Every rule a config must keep; errors name the field (YAML keys are the field names)."""
    if not isinstance(cfg.partitions, tuple) or not cfg.partitions:
        raise SpecError("partitions", "expected a non-empty tuple of PartitionSpec")
    if len(cfg.partitions) > MAX_PARTITIONS:
        raise SpecError("partitions", f"at most {MAX_PARTITIONS} partitions")
    seen: set[str] = set()
    for p in cfg.partitions:
        _check_partition(p, seen)
        seen.add(p.name)
    for required in (STATELESS, BATCH):
        if required not in seen:
            raise SpecError(
                "partitions", f"must include {required!r} (got {', '.join(sorted(seen))})"
            )
    if cfg.default_partition not in seen:
        raise SpecError(
            "default_partition",
            f"names no configured partition, got {_show(cfg.default_partition)}",
        )
    for name in _DURATIONS:
        positive = name in ("interval_s", "window_s", "stale_after_s")
        _check_number(getattr(cfg, name), name, 0.0, MAX_DURATION_S, low_open=positive)
    for name in _FRACTIONS:
        _check_number(getattr(cfg, name), name, 0.0, 1.0, low_open=True)
    if not cfg.cold_fraction < cfg.hot_fraction:
        raise SpecError(
            "cold_fraction",
            f"must be below hot_fraction ({cfg.hot_fraction}) to leave a dead band, "
            f"got {cfg.cold_fraction}",
        )
    if cfg.spike_fraction < cfg.hot_fraction:
        raise SpecError(
            "spike_fraction",
            f"must be at least hot_fraction ({cfg.hot_fraction}): a spike is hotter than hot, "
            f"got {cfg.spike_fraction}",
        )
    for name in _COUNTS:
        _check_int(getattr(cfg, name), name, 1)
    if not isinstance(cfg.forecast, bool):
        raise SpecError("forecast", f"expected true or false, got {_show(cfg.forecast)}")


def _check_partition(p: object, seen: set[str]) -> None:
    if not isinstance(p, PartitionSpec):
        raise SpecError("partitions", f"expected PartitionSpec entries, got {_show(p)}")
    where = f"partitions.{p.name}" if isinstance(p.name, str) else "partitions"
    if not isinstance(p.name, str) or not all(
        _SEGMENT_RE.fullmatch(seg) for seg in p.name.split("/")
    ):
        raise SpecError(
            where,
            "a partition name is lowercase letters, digits, - and _ (1-32), or parent/child,"
            f" got {_show(p.name)}",
        )
    if p.name in seen:
        raise SpecError(where, "named twice")
    if p.name.count("/") > 1:
        raise SpecError(where, "virtual partitions are one level deep: parent/child")
    if "/" in p.name:
        if p.parent not in (STATELESS, BATCH):
            raise SpecError(
                where, f"a virtual partition lies inside stateless or batch, not {p.parent!r}"
            )
        if p.parent not in seen:
            raise SpecError(where, f"its parent {p.parent!r} must be declared before it")
    elif p.name not in (STATELESS, BATCH):
        raise SpecError(
            where,
            "the top-level partitions are stateless and batch; declare others inside one "
            "as parent/child",
        )
    _check_int(p.min_nodes, f"{where}.min_nodes", 0)
    _check_number(p.oversubscribe, f"{where}.oversubscribe", 1.0, MAX_OVERSUBSCRIBE)
    if not isinstance(p.protected, bool):
        raise SpecError(f"{where}.protected", f"expected true or false, got {_show(p.protected)}")
    if p.protected and "/" not in p.name:
        raise SpecError(
            f"{where}.protected", "only a virtual partition (parent/child) can be protected"
        )


def _check_number(value: object, field: str, low: float, high: float, low_open=False) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise SpecError(field, f"expected a number, got {_show(value)}")
    if not math.isfinite(value) or value > high or value < low or (low_open and value == low):
        interval = f"{'(' if low_open else '['}{low:g}, {high:g}]"
        raise SpecError(field, f"must be in {interval}, got {_show(value)}")


def _check_int(value: object, field: str, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise SpecError(field, f"expected a whole number, got {_show(value)}")
    if not low <= value <= MAX_COUNT:
        raise SpecError(field, f"must be between {low} and {MAX_COUNT}, got {_show(value)}")


# --------------------------------------------------------------------------- parsing


def parse_partitions_config(text: str | bytes | Mapping[str, Any]) -> PartitionsConfig:
    """The config in YAML text (or UTF-8 bytes, or an already-decoded mapping), checked
    field by field; :class:`SpecError` names the first bad field. Keys not given keep
    their defaults; an empty document is the default config."""
    data = _load(text)
    if data is None:
        return PartitionsConfig()
    if not isinstance(data, Mapping):
        raise SpecError("", f"expected a mapping of settings, got {_show(data)}")
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        if key not in _TOP_FIELDS:
            raise SpecError(
                str(key)[:64] if isinstance(key, str) else _show(key),
                f"unknown field (known: {', '.join(sorted(_TOP_FIELDS))})",
            )
        if value is None:
            continue
        if key == "partitions":
            kwargs["partitions"] = _partitions(value)
        elif key in _DURATIONS:
            kwargs[key] = parse_duration(value, key)
        elif key == "default_partition" and not isinstance(value, str):
            raise SpecError(key, f"expected a partition name, got {_show(value)}")
        else:
            kwargs[key] = value  # type-checked by PartitionsConfig's own checks
    return PartitionsConfig(**kwargs)


def _partitions(value: object) -> tuple[PartitionSpec, ...]:
    if not isinstance(value, Mapping):
        raise SpecError("partitions", f"expected a mapping of name -> settings, got {_show(value)}")
    if len(value) > MAX_PARTITIONS:
        raise SpecError("partitions", f"at most {MAX_PARTITIONS} partitions, got {len(value)}")
    specs = []
    for name, body in value.items():
        if not isinstance(name, str):
            raise SpecError("partitions", f"a partition name is text, got {_show(name)}")
        where = f"partitions.{name[:64]}"
        body = {} if body is None else body
        if not isinstance(body, Mapping):
            raise SpecError(where, f"expected a mapping of settings, got {_show(body)}")
        for key in body:
            if key not in _PARTITION_FIELDS:
                raise SpecError(
                    f"{where}.{str(key)[:64]}",
                    f"unknown field (known: {', '.join(_PARTITION_FIELDS)})",
                )
        given = {k: v for k, v in body.items() if v is not None}
        if isinstance(given.get("oversubscribe"), int) and not isinstance(
            given["oversubscribe"], bool
        ):
            given["oversubscribe"] = float(given["oversubscribe"])
        specs.append(PartitionSpec(name, **given))
    # Parents first, so `batch/critical` may be written above `batch` in the file.
    specs.sort(key=lambda p: "/" in p.name)
    return tuple(specs)


def _load(source: object) -> object:
    if isinstance(source, Mapping):
        return source
    if isinstance(source, bytes | bytearray):
        if len(source) > MAX_SOURCE_BYTES:
            raise SpecError("", f"config is over {MAX_SOURCE_BYTES} bytes")
        try:
            source = bytes(source).decode("utf-8")
        except UnicodeDecodeError as err:
            raise SpecError("", f"not valid UTF-8: {err.reason} at byte {err.start}") from None
    if not isinstance(source, str):
        raise SpecError("", f"expected YAML text, got {type(source).__name__}")
    if len(source) > MAX_SOURCE_BYTES:
        raise SpecError("", f"config is over {MAX_SOURCE_BYTES} characters")
    try:
        return yaml.load(source, Loader=_Loader)  # a SafeLoader
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        where = f"line {mark.line + 1}: " if mark is not None else ""
        raise SpecError("", f"invalid YAML: {where}{err.problem or err.context}") from None
    except (yaml.YAMLError, RecursionError) as err:
        raise SpecError("", f"invalid YAML: {str(err)[:200]}") from None
    except _UNREADABLE as err:
        raise SpecError("", f"invalid YAML: {_unreadable(err)}") from None
