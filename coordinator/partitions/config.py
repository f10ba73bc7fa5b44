"""The partitions' settings: which partitions exist, and the controller's knobs.

INTERIM (pmoves): the minimal form of pcontroller's `config.py`, with the dataclasses
exactly as agreed in briefs/partitions-interface.md; pcontroller's version (same names,
same fields) replaces this file at merge. `parse_partitions_config` reads YAML text:

```yaml
default_partition: batch
partitions:
  stateless: {min_nodes: 2}
  batch: {oversubscribe: 1.5}
  batch/critical: {protected: true}
interval_s: 10
```

Every problem names its field, in a `SpecError` (the first one found).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

import yaml

from workloads.quantity import SpecError

STATELESS, BATCH = "stateless", "batch"
_NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,31}(/[a-z0-9][a-z0-9_-]{0,31})?")


@dataclass(frozen=True)
class PartitionSpec:
    name: str  # "stateless", "batch", or virtual "batch/critical" (parent/child)
    min_nodes: int = 0
    oversubscribe: float = 1.0  # allocatable = oversubscribe x capacity (>= 1.0)
    protected: bool = False  # virtual partitions only: its nodes are never lent


@dataclass(frozen=True)
class PartitionsConfig:
    partitions: tuple[PartitionSpec, ...] = (PartitionSpec(STATELESS), PartitionSpec(BATCH))
    default_partition: str = BATCH
    interval_s: float = 10.0
    window_s: float = 300.0
    stale_after_s: float = 30.0
    busy_line: float = 0.7
    hot_fraction: float = 0.6
    cold_fraction: float = 0.4
    borrow_after_s: float = 20.0
    return_after_s: float = 600.0
    cooldown_s: float = 300.0
    nodes_per_move: int = 10
    moves_per_hour: int = 120
    max_draining: int = 20
    max_draining_per_zone: int = 10
    forecast: bool = True


_SPEC_FIELDS = {f.name: f.type for f in fields(PartitionSpec) if f.name != "name"}
_TOP_FIELDS = {f.name for f in fields(PartitionsConfig)}


def parse_partitions_config(text: str) -> PartitionsConfig:
    """A `PartitionsConfig` from YAML text (empty text: the defaults)."""
    try:
        doc = yaml.safe_load(text) if text.strip() else {}
    except yaml.YAMLError as exc:
        raise SpecError("", f"not valid YAML: {exc}") from None
    if doc is None:
        doc = {}
    if not isinstance(doc, Mapping):
        raise SpecError("", f"expected a mapping, got {type(doc).__name__}")
    unknown = sorted(str(k) for k in doc if k not in _TOP_FIELDS)
    if unknown:
        raise SpecError(unknown[0], f"unknown field; known: {', '.join(sorted(_TOP_FIELDS))}")
    values: dict[str, Any] = {}
    defaults = PartitionsConfig()
    for f in fields(PartitionsConfig):
        if f.name == "partitions" or f.name not in doc:
            continue
        values[f.name] = _value(doc[f.name], getattr(defaults, f.name), f.name)
    if "partitions" in doc:
        values["partitions"] = _partitions(doc["partitions"])
    cfg = PartitionsConfig(**values)
    _check(cfg)
    return cfg


def _value(value: Any, default: Any, field: str) -> Any:
    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise SpecError(field, "expected true or false")
        return value
    if isinstance(default, int):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise SpecError(field, "expected a whole number >= 0")
        return value
    if isinstance(default, float):
        if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
            raise SpecError(field, "expected a number >= 0")
        return float(value)
    if not isinstance(value, str):
        raise SpecError(field, "expected a string")
    return value


def _partitions(doc: Any) -> tuple[PartitionSpec, ...]:
    if not isinstance(doc, Mapping) or not doc:
        raise SpecError("partitions", "expected a mapping of partition name to settings")
    out = []
    for name, settings in doc.items():
        where = f"partitions.{name}"
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise SpecError(where, "a name is 1-32 of a-z 0-9 _ -, or parent/child")
        settings = {} if settings is None else settings
        if not isinstance(settings, Mapping):
            raise SpecError(where, "expected a mapping of settings")
        kw = {}
        for key, value in settings.items():
            if key not in _SPEC_FIELDS:
                raise SpecError(
                    f"{where}.{key}", f"unknown field; known: {', '.join(_SPEC_FIELDS)}"
                )
            kw[key] = _value(value, getattr(PartitionSpec(name), key), f"{where}.{key}")
        out.append(PartitionSpec(name, **kw))
    return tuple(out)


def _check(cfg: PartitionsConfig) -> None:
    names = {p.name for p in cfg.partitions}
    for p in cfg.partitions:
        where = f"partitions.{p.name}"
        if p.oversubscribe < 1.0:
            raise SpecError(f"{where}.oversubscribe", f"must be >= 1.0, got {p.oversubscribe}")
        parent, _, child = p.name.partition("/")
        if child and parent not in names:
            raise SpecError(where, f"its parent partition {parent} is not defined")
        if p.protected and not child:
            raise SpecError(f"{where}.protected", "only a virtual partition (parent/child) may be")
    if cfg.default_partition not in names:
        raise SpecError("default_partition", f"{cfg.default_partition} is not a partition")
    if not 0 <= cfg.cold_fraction <= cfg.hot_fraction <= 1:
        raise SpecError("cold_fraction", "needs 0 <= cold_fraction <= hot_fraction <= 1")
    if not 0 < cfg.busy_line <= 1:
        raise SpecError("busy_line", f"must be in (0, 1], got {cfg.busy_line}")
    if cfg.interval_s <= 0:
        raise SpecError("interval_s", "must be > 0")
