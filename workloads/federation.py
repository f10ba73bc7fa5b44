"""A job spec's federation fields: which regions it may run in and when it may move.

``regions: [eu, us]`` (ordered preference), ``spill: {after: 30s}`` or ``spill: never``
(the default), ``lost_after: 10m`` (default never). A spec naming none of them behaves
as before: it stays in the region it was submitted to. One whose ``regions`` do not name
the region it was submitted to is made in the first region they name (its home:
coordinator/federation/forward.py). The coordinator builds the
federation core's ``FedPolicy`` from these (coordinator/federation/model.py applies the
same rules again, so the two never disagree).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from workloads.quantity import SpecError, _show, parse_duration

FIELDS = ("regions", "spill", "lost_after")
MAX_REGIONS = 32  # as coordinator.federation.model.MAX_REGIONS
MAX_DURATION_S = 30 * 86400.0  # as coordinator.federation.model.MAX_DURATION_S
_REGION = re.compile(r"[A-Za-z0-9_-]{1,64}")  # a NATS subject token (mesh.subjects)
NEVER = "never"


def parse(f: Mapping[str, Any]) -> tuple[tuple[str, ...], float | None, float | None]:
    """``(regions, spill_after_s, lost_after_s)`` from a spec's given fields."""
    regions = _regions(f.get("regions", []))
    spill = _spill(f.get("spill", NEVER))
    lost = None
    if "lost_after" in f and f["lost_after"] != NEVER:
        lost = _duration(f["lost_after"], "lost_after", positive=True)
    if spill is not None and not regions:
        raise SpecError("spill", "needs `regions`: the regions the job may spill to")
    return regions, spill, lost


def _regions(value: object) -> tuple[str, ...]:
    if not isinstance(value, list | tuple):
        raise SpecError("regions", f"expected a list of region names, got {_show(value)}")
    if len(value) > MAX_REGIONS:
        raise SpecError("regions", f"at most {MAX_REGIONS} regions, got {len(value)}")
    seen: list[str] = []
    for i, region in enumerate(value):
        if not isinstance(region, str) or not _REGION.fullmatch(region) or region == "fed":
            raise SpecError(
                f"regions[{i}]",
                "a region is 1-64 letters, digits, '_' or '-' (and not 'fed'), "
                f"got {_show(region)}",
            )
        if region in seen:
            raise SpecError(f"regions[{i}]", f"{region!r} is named twice")
        seen.append(region)
    return tuple(seen)


def _spill(value: object) -> float | None:
    if value == NEVER:
        return None
    if not isinstance(value, Mapping):
        raise SpecError(
            "spill", f"expected `never` or a mapping like {{after: 30s}}, got {_show(value)}"
        )
    unknown = [k for k in value if k != "after"]
    if unknown:
        raise SpecError(f"spill.{str(unknown[0])[:64]}", "unknown field (known: after)")
    if value.get("after") is None:
        raise SpecError("spill.after", "required (how long the job waits at home first)")
    return _duration(value["after"], "spill.after", positive=False)


def _duration(value: object, field: str, *, positive: bool) -> float:
    seconds = parse_duration(value, field)
    if positive and seconds <= 0:
        raise SpecError(field, "must be more than 0")
    if seconds > MAX_DURATION_S:
        raise SpecError(field, f"at most {MAX_DURATION_S:.0f}s (30 days), got {seconds:g}s")
    return seconds


def to_dict(
    regions: tuple[str, ...], spill_after: float | None, lost_after: float | None
) -> dict[str, Any]:
    """The fields as ``parse`` reads them back; none at all for a job that names none (so
    specs from before federation keep their exact shape)."""
    out: dict[str, Any] = {}
    if regions:
        out["regions"] = list(regions)
    if spill_after is not None:
        out["spill"] = {"after": float(spill_after)}
    if lost_after is not None:
        out["lost_after"] = float(lost_after)
    return out
