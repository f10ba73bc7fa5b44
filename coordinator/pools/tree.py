"""The pool tree: per-kind reservation / limit / share / type, validated once.

A pool is named by its path (``/``, ``/ml``, ``/ml/vision``); jobs are submitted to leaves.
For each resource kind in :data:`POOL_KINDS` a pool has

- ``reservation`` -- guaranteed to it (if its demand reaches it, or always if ``static``);
- ``limit`` -- never exceeded (``None``: no limit of its own, its parent's applies);
- ``share`` -- its weight when the surplus is divided (a positive decimal, 0.001 steps);
- ``type`` -- ``elastic`` (an unused reservation may be lent to others) or ``static``
  (the reservation is held even when idle, and never lent).

Amounts are exact integers in the units of :class:`workloads.resources.Resources`: cpu in
millicores, memory and disk in bytes, gpu in milli-GPUs. ``gpu_memory`` is not pooled.

The root ``/`` stands for the whole cluster: its entitlement is the capacity it is given,
so it takes no resource settings of its own.

:func:`parse_pool_tree` reads the YAML form::

    pools:
      /ml:
        type: elastic               # default type for this pool's kinds
        share: 1                    # default share for this pool's kinds
        cpu:    {reservation: 20, limit: 100, share: 2}
        memory: {reservation: 64Gi, limit: 256Gi}
        gpu:    {reservation: 2, limit: 8, type: static}
      /ml/vision:
        gpu: {reservation: 2, limit: 4}

Every problem found is reported at once, each naming the pool path and the field, e.g.
``/ml/vision: cpu limit 10 is below its reservation 20``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from enum import StrEnum
from types import MappingProxyType
from typing import Any, NamedTuple

import yaml

from workloads.quantity import (
    SpecError,
    _show,
    format_bytes,
    format_cpu,
    format_gpu,
    parse_bytes,
    parse_cpu,
    parse_gpu,
)

# The job-spec loader: a SafeLoader that rejects duplicate keys (a pool defined twice).
from workloads.spec import _UNREADABLE, MAX_POOL_DEPTH, _unreadable
from workloads.spec import _Loader as _SpecLoader

__all__ = [
    "MAX_DESCRIPTION",
    "MAX_POOLS",
    "MAX_SHARE",
    "POOL_KINDS",
    "ROOT",
    "PoolConfigError",
    "PoolSpec",
    "PoolTree",
    "PoolType",
    "ResourceSpec",
    "format_amount",
    "load_pool_source",
    "parse_pool_tree",
]

POOL_KINDS: tuple[str, ...] = ("cpu", "memory", "disk", "gpu")
"""The kinds pools govern, in the order every per-kind vector here uses."""

ROOT = "/"
MAX_POOLS = 100_000
MAX_SHARE = 1_000_000
MAX_SOURCE_BYTES = 4 << 20  # YAML text of one pool tree
# Characters in one pool's description. Bounded because a YAML alias repeats a string
# without repeating its text: 1 MiB of `description: *d` once made a tree whose log
# event was gigabytes.
MAX_DESCRIPTION = 1024

_SEGMENT_RE = re.compile(r"[a-z0-9_-]{1,32}")  # the same rule as a job's `pool` (workloads.spec)
_PARSERS: dict[str, Callable[[object, str], int]] = {
    "cpu": parse_cpu, "memory": parse_bytes, "disk": parse_bytes, "gpu": parse_gpu,
}
_FORMATS: dict[str, Callable[[int], str]] = {
    "cpu": format_cpu, "memory": format_bytes, "disk": format_bytes, "gpu": format_gpu,
}
_POOL_FIELDS = ("type", "share", "description", *POOL_KINDS)
_KIND_FIELDS = ("reservation", "limit", "share", "type")


class _YamlLoader(_SpecLoader):  # type: ignore[misc, valid-type]
    max_nodes = None  # a pool tree is bounded by MAX_SOURCE_BYTES and MAX_POOLS only


def format_amount(kind: str, amount: int) -> str:
    """An amount as a person writes it: ``format_amount("gpu", 6000) == "6"``,
    ``format_amount("cpu", 500) == "500m"``, ``format_amount("memory", 2**31) == "2Gi"``."""
    return _FORMATS[kind](amount)


class PoolType(StrEnum):
    ELASTIC = "elastic"
    STATIC = "static"


@dataclass(frozen=True, slots=True)
class ResourceSpec:
    """One kind's settings for one pool (units as in :class:`workloads.resources.Resources`)."""

    reservation: int = 0
    limit: int | None = None
    share: float = 1.0
    type: PoolType = PoolType.ELASTIC


_DEFAULT = ResourceSpec()


@dataclass(frozen=True, slots=True)
class PoolSpec:
    """One pool's configuration. Build trees of them with :class:`PoolTree`, which validates."""

    path: str
    cpu: ResourceSpec = _DEFAULT
    memory: ResourceSpec = _DEFAULT
    disk: ResourceSpec = _DEFAULT
    gpu: ResourceSpec = _DEFAULT
    description: str = ""

    def resource(self, kind: str) -> ResourceSpec:
        if kind not in POOL_KINDS:
            raise KeyError(kind)
        return getattr(self, kind)

    @property
    def parent(self) -> str | None:
        return _parent(self.path)


class PoolConfigError(SpecError):
    """A pool tree that cannot be accepted. ``problems`` lists every ``(path, problem)``
    found; ``field``/``problem`` are the first one's (as for any :class:`SpecError`), and the
    message is all of them, one per line."""

    def __init__(self, problems: Iterable[tuple[str, str]]) -> None:
        self.problems: tuple[tuple[str, str], ...] = tuple(problems) or (("", "invalid"),)
        super().__init__(*self.problems[0])
        self.args = ("\n".join(f"{p}: {m}" if p else m for p, m in self.problems),)

    def __str__(self) -> str:
        return self.args[0]

    def __reduce__(self):
        return (type(self), (self.problems,))


def _parent(path: str) -> str | None:
    if path == ROOT:
        return None
    head = path.rsplit("/", 1)[0]
    return head or ROOT


def _path_problem(path: object) -> str | None:
    if not isinstance(path, str):
        return f"a pool path must be a string, got {type(path).__name__}"
    if path == ROOT:
        return None
    segments = path.split("/")
    if segments[0] != "" or not all(_SEGMENT_RE.fullmatch(s) for s in segments[1:]):
        return ("expected '/' or a path like /ml/vision (segments of 1-32 a-z, 0-9, '_', '-')")
    if len(segments) - 1 > MAX_POOL_DEPTH:
        return f"at most {MAX_POOL_DEPTH} levels deep (MAX_POOL_DEPTH), got {len(segments) - 1}"
    return None


def _text(value: object) -> str:
    """str() of a user value; an int too big to print (str() raises past 4300 digits, and
    YAML reads ``0x...`` ints of any length) is described instead."""
    if isinstance(value, int) and value.bit_length() > 1024:
        return _show(value)
    return str(value)


def _share_weight(share: object) -> int | None:
    """The share in thousandths (exact), or None when it is not a valid share."""
    if isinstance(share, bool) or not isinstance(share, int | float):
        return None
    if isinstance(share, int) and not 0 < share <= MAX_SHARE:
        return None  # and never str() a huge one
    if isinstance(share, float) and not math.isfinite(share):
        return None
    try:
        milli = Decimal(str(share)) * 1000
    except InvalidOperation:  # pragma: no cover - str() of a finite number always parses
        return None
    if milli != milli.to_integral_value() or not 0 < milli <= MAX_SHARE * 1000:
        return None
    return int(milli)


def _is_amount(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


# --------------------------------------------------------------------------- the tree


NO_LIMIT = 1 << 126
"""Stands for "no limit" where a number is needed: above any sum of amounts."""


class Family(NamedTuple):
    """A parent and its children, as entitlement divides among them, for one kind. The
    children are ``order[lo:hi]`` (breadth-first order keeps siblings together);
    ``reservations``/``limits``/``weights`` are theirs (``limits`` with ``None`` for none,
    ``weights`` the shares in thousandths), ``steps`` is ``lcm(weights) // weight`` each (so
    ``(n + 1) * step`` orders next-unit levels as exact integers), ``unlimited`` whether no
    child has a limit."""

    parent: int
    lo: int
    hi: int
    reservations: tuple[int, ...]
    limits: tuple[int | None, ...]
    weights: tuple[int, ...]
    weight_sum: int
    steps: tuple[int, ...]
    unlimited: bool


@dataclass(frozen=True)
class PoolTree:
    """A validated pool tree. ``PoolTree(specs)`` raises :class:`PoolConfigError` listing
    every problem. The root ``/`` is added (with no settings) when ``specs`` lacks it.

    Besides the specs, the tree holds a flat index used by the decision functions:
    ``order`` (root first, every parent before its children, siblings by path), and per
    kind the reservation, effective limit (own or nearest ancestor's; ``None`` = none),
    share weight (thousandths) and static flag, each a tuple in ``order``; for
    entitlement, per kind, each pool's ``floor`` (its reservation if static, else 0) and
    ``ceiling`` (its effective limit, or :data:`NO_LIMIT`), and the :class:`Family` of every
    parent.
    """

    specs: tuple[PoolSpec, ...]
    pools: Mapping[str, PoolSpec] = field(init=False, repr=False, compare=False)
    order: tuple[str, ...] = field(init=False, repr=False, compare=False)
    index: Mapping[str, int] = field(init=False, repr=False, compare=False)
    parent_index: tuple[int, ...] = field(init=False, repr=False, compare=False)
    child_index: tuple[tuple[int, ...], ...] = field(init=False, repr=False, compare=False)
    reservation: Mapping[str, tuple[int, ...]] = field(init=False, repr=False, compare=False)
    limit: Mapping[str, tuple[int | None, ...]] = field(init=False, repr=False, compare=False)
    weight: Mapping[str, tuple[int, ...]] = field(init=False, repr=False, compare=False)
    static: Mapping[str, tuple[bool, ...]] = field(init=False, repr=False, compare=False)
    families: Mapping[str, tuple[Family, ...]] = field(init=False, repr=False, compare=False)
    floor: Mapping[str, tuple[int, ...]] = field(init=False, repr=False, compare=False)
    ceiling: Mapping[str, tuple[int, ...]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        specs = tuple(self.specs)
        if not any(isinstance(s, PoolSpec) and s.path == ROOT for s in specs):
            specs = (PoolSpec(ROOT), *specs)
        specs = tuple(sorted(specs, key=lambda s: str(getattr(s, "path", ""))))
        by_path = _validate(specs)
        # Breadth-first: every parent before its children, siblings in path order.
        children: dict[str, list[str]] = {p: [] for p in by_path}
        for p in by_path:
            if p != ROOT:
                children[_parent(p)].append(p)
        order = [ROOT]
        for p in order:
            order.extend(children[p])
        index = {p: i for i, p in enumerate(order)}
        limits = {k: tuple(self._effective_limits(by_path, order, k)) for k in POOL_KINDS}
        put = object.__setattr__
        put(self, "specs", specs)
        put(self, "pools", MappingProxyType(by_path))
        put(self, "order", tuple(order))
        put(self, "index", MappingProxyType(index))
        put(self, "parent_index", tuple(-1 if p == ROOT else index[_parent(p)] for p in order))
        put(self, "child_index", tuple(tuple(index[c] for c in children[p]) for p in order))
        put(self, "limit", MappingProxyType(limits))
        put(self, "reservation", MappingProxyType(
            {k: tuple(by_path[p].resource(k).reservation for p in order) for k in POOL_KINDS}))
        put(self, "weight", MappingProxyType(
            {k: tuple(_share_weight(by_path[p].resource(k).share) for p in order)
             for k in POOL_KINDS}))
        put(self, "static", MappingProxyType(
            {k: tuple(by_path[p].resource(k).type is PoolType.STATIC for p in order)
             for k in POOL_KINDS}))
        put(self, "families", MappingProxyType({k: self._families(k) for k in POOL_KINDS}))
        put(self, "floor", MappingProxyType(
            {k: tuple(r if st else 0
                      for r, st in zip(self.reservation[k], self.static[k], strict=True))
             for k in POOL_KINDS}))
        put(self, "ceiling", MappingProxyType(
            {k: tuple(NO_LIMIT if v is None else v for v in self.limit[k]) for k in POOL_KINDS}))

    def _families(self, kind: str) -> tuple[Family, ...]:
        weight, limit, res = self.weight[kind], self.limit[kind], self.reservation[kind]
        out = []
        for i, ch in enumerate(self.child_index):
            if ch:
                lo, hi = ch[0], ch[-1] + 1
                assert ch == tuple(range(lo, hi))  # siblings are contiguous in `order`
                ws = weight[lo:hi]
                common = math.lcm(*ws)
                out.append(Family(i, lo, hi, res[lo:hi], limit[lo:hi], ws, sum(ws),
                                  tuple(common // w for w in ws),
                                  all(v is None for v in limit[lo:hi])))
        return tuple(out)

    @staticmethod
    def _effective_limits(by_path: Mapping[str, PoolSpec], order: list[str], kind: str):
        eff: dict[str, int | None] = {}
        for p in order:
            own = by_path[p].resource(kind).limit if p != ROOT else None
            inherited = eff[_parent(p)] if p != ROOT else None
            eff[p] = own if own is not None else inherited
            yield eff[p]

    # ------------------------------------------------------------------ queries

    def __contains__(self, path: object) -> bool:
        return path in self.pools

    def __len__(self) -> int:
        return len(self.order)

    def __getitem__(self, path: str) -> PoolSpec:
        return self.pools[path]

    def parent(self, path: str) -> str | None:
        if path not in self.pools:
            raise KeyError(path)
        return _parent(path)

    def children(self, path: str) -> tuple[str, ...]:
        return tuple(self.order[i] for i in self.child_index[self.index[path]])

    def is_leaf(self, path: str) -> bool:
        return not self.child_index[self.index[path]]

    def leaves(self) -> tuple[str, ...]:
        return tuple(p for i, p in enumerate(self.order) if not self.child_index[i])

    def ancestors(self, path: str) -> tuple[str, ...]:
        """Parent first, root last."""
        out = []
        p = self.parent(path)
        while p is not None:
            out.append(p)
            p = _parent(p)
        return tuple(out)

    def effective_limit(self, path: str, kind: str) -> int | None:
        """The pool's own limit for ``kind``, or its nearest ancestor's; None if none has one."""
        return self.limit[kind][self.index[path]]


def _validate(specs: tuple[PoolSpec, ...]) -> dict[str, PoolSpec]:
    """The specs by path, or a :class:`PoolConfigError` with every problem found, sorted by
    pool path (so each pool's problems stand together)."""
    if len(specs) > MAX_POOLS:
        raise PoolConfigError([("", f"at most {MAX_POOLS} pools (MAX_POOLS), got {len(specs)}")])
    problems: list[tuple[str, str]] = []
    by_path: dict[str, PoolSpec] = {}
    for s in specs:
        if not isinstance(s, PoolSpec):
            problems.append(("", f"expected a PoolSpec, got {type(s).__name__}"))
            continue
        bad = _path_problem(s.path)
        if bad:
            problems.append((_text(s.path)[:80], bad))
        elif s.path in by_path:
            problems.append((s.path, "defined twice"))
        else:
            by_path[s.path] = s
    good: dict[str, dict[str, ResourceSpec]] = {}  # per pool, its kinds that are valid alone
    for p, s in by_path.items():
        parent = _parent(p)
        if parent is not None and parent not in by_path:
            problems.append((p, f"its parent pool {parent} is not defined"))
        if p == ROOT:
            set_kinds = [k for k in POOL_KINDS if s.resource(k) != _DEFAULT]
            if set_kinds:
                problems.append((p, f"{', '.join(set_kinds)}: the root stands for the whole "
                                    "cluster, whose capacity is its entitlement; set "
                                    "reservations, limits, shares and types on its children"))
            continue
        good[p] = {}
        for kind in POOL_KINDS:
            r = s.resource(kind)
            found = (_kind_problems(kind, r) if isinstance(r, ResourceSpec)
                     else [f"{kind}: expected a ResourceSpec, got {type(r).__name__}"])
            problems.extend((p, m) for m in found)
            if not found:
                good[p][kind] = r
    # Across pools (values valid on their own only): a limit against the nearest ancestor's,
    # the children's reservations against their parent's. The root's children are checked
    # against the capacity instead, when there is one (entitlement.reservation_shortfall).
    by_depth = sorted(good, key=lambda q: q.count("/"))
    for kind in POOL_KINDS:
        fmt = _FORMATS[kind]
        eff: dict[str, tuple[int | None, str]] = {ROOT: (None, ROOT)}
        kids: dict[str, list[tuple[str, int]]] = {}
        for p in by_depth:
            r = good[p].get(kind)
            parent = _parent(p)
            inherited, owner = eff.get(parent, (None, parent))
            if r is None or r.limit is None:
                eff[p] = (inherited, owner)
            else:
                if inherited is not None and r.limit > inherited:
                    whose = ("its parent's" if owner == parent
                             else f"{owner}'s (inherited by {parent})")
                    problems.append((p, f"{kind} limit {fmt(r.limit)} is above {whose} limit "
                                        f"{fmt(inherited)}"))
                eff[p] = (r.limit, p)
            if r is not None:
                kids.setdefault(parent, []).append((p, r.reservation))
        for parent, group in kids.items():
            own = good.get(parent, {}).get(kind)
            total = sum(v for _, v in group)
            if own is not None and total > own.reservation:
                listed = ", ".join(f"{c} {fmt(v)}" for c, v in group if v)
                problems.append((parent, f"{kind} reservations of its children sum to "
                                         f"{fmt(total)} ({listed}), above its own reservation "
                                         f"{fmt(own.reservation)}"))
    if problems:
        raise PoolConfigError(sorted(problems, key=lambda pm: pm[0]))
    return by_path


def _kind_problems(kind: str, r: ResourceSpec) -> list[str]:
    fmt = _FORMATS[kind]
    out = []
    if not _is_amount(r.reservation):
        out.append(f"{kind} reservation must be a non-negative integer, got {_show(r.reservation)}")
    if r.limit is not None and not _is_amount(r.limit):
        out.append(f"{kind} limit must be a non-negative integer or None, got {_show(r.limit)}")
    if not out and r.limit is not None and r.limit < r.reservation:
        out.append(f"{kind} limit {fmt(r.limit)} is below its reservation {fmt(r.reservation)}")
    if _share_weight(r.share) is None:
        out.append(f"{kind} share must be a number above 0 and at most {MAX_SHARE}, in steps "
                   f"of 0.001, got {_show(r.share)}")
    if not isinstance(r.type, PoolType):
        out.append(f"{kind} type must be elastic or static, got {_show(r.type)}")
    return out


# --------------------------------------------------------------------------- YAML


def parse_pool_tree(source: str | bytes | Mapping[str, Any]) -> PoolTree:
    """A :class:`PoolTree` from YAML text (or bytes, or the already-decoded mapping).

    The document is a mapping with one key, ``pools``: a mapping from pool path to that
    pool's settings (see the module docstring). Quantities use Kubernetes notation through
    :mod:`workloads.quantity` (cpu ``500m``/``2``, memory ``64Mi``/``2Gi``, gpu ``0.5``/``2``).
    Kinds a pool leaves out get reservation 0, no limit of its own, share 1, elastic.
    Raises :class:`PoolConfigError` listing every problem, each naming the pool and field.
    """
    data = _load(source)
    if not isinstance(data, Mapping):
        raise PoolConfigError([("", f"expected a mapping with a 'pools' key, got "
                                    f"{type(data).__name__}")])
    unknown = [k for k in data if k != "pools"]
    if unknown:
        raise PoolConfigError([("", f"unknown top-level field {_text(unknown[0])!r} "
                                    "(known: pools)")])
    pools = data.get("pools")
    if not isinstance(pools, Mapping):
        raise PoolConfigError([("pools", "expected a mapping from pool path to its settings, "
                                         f"got {type(pools).__name__}")])
    if len(pools) > MAX_POOLS:  # before reading each one: that took seconds
        raise PoolConfigError([("pools", f"at most {MAX_POOLS} pools (MAX_POOLS), "
                                         f"got {len(pools)}")])
    problems: list[tuple[str, str]] = []
    specs = []
    for path, body in pools.items():
        bad = _path_problem(path)
        if bad:
            problems.append((_text(path)[:80], bad))
            continue
        # A value with a problem is reported here and replaced by its default, so the tree
        # checks still run on the rest and every problem is reported in one go.
        specs.append(_pool_spec(path, {} if body is None else body, problems))
    try:
        tree = PoolTree(tuple(specs))
    except PoolConfigError as err:
        problems.extend(err.problems)
    if problems:
        raise PoolConfigError(sorted(problems, key=lambda pm: pm[0]))
    return tree


def load_pool_source(source: str | bytes | Mapping[str, Any]) -> object:
    """The plain data of a pool tree document, read the way :func:`parse_pool_tree` reads
    it (libyaml when present, duplicate keys refused); :class:`PoolConfigError` if it
    cannot be read."""
    return _load(source)


def _load(source: object) -> object:
    if isinstance(source, Mapping):
        return source
    if isinstance(source, bytes | bytearray):
        try:
            source = bytes(source).decode("utf-8")
        except UnicodeDecodeError as err:
            raise PoolConfigError(
                [("", f"not valid UTF-8: {err.reason} at byte {err.start}")]) from None
    if not isinstance(source, str):
        raise PoolConfigError([("", "expected YAML text, bytes or a mapping, got "
                                    f"{type(source).__name__}")])
    if len(source) > MAX_SOURCE_BYTES:
        raise PoolConfigError([("", f"pool tree is over {MAX_SOURCE_BYTES} characters")])
    try:
        return yaml.load(source, Loader=_YamlLoader)  # a SafeLoader
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        where = f"line {mark.line + 1}: " if mark is not None else ""
        raise PoolConfigError([("", f"invalid YAML: {where}{err.problem or err.context}")]) \
            from None
    except (yaml.YAMLError, RecursionError) as err:
        raise PoolConfigError([("", f"invalid YAML: {err}")]) from None
    except _UNREADABLE as err:  # e.g. an int of over 4300 digits (see workloads.spec)
        raise PoolConfigError([("", f"invalid YAML: {_unreadable(err)}")]) from None


def _pool_spec(path: str, body: object, problems: list[tuple[str, str]]) -> PoolSpec:
    if not isinstance(body, Mapping):
        problems.append((path, f"expected a mapping of settings, got {type(body).__name__}"))
        return PoolSpec(path)
    for key in body:
        if key not in _POOL_FIELDS:
            problems.append((path, f"unknown field {_text(key)!r} (known: "
                                   f"{', '.join(_POOL_FIELDS)})"))
    default_type = _type(body.get("type", "elastic"), path, "type", problems)
    default_share = _share(body.get("share", 1), path, "share", problems)
    description = body.get("description", "")
    if not isinstance(description, str):
        problems.append((path, f"description must be a string, got {type(description).__name__}"))
        description = ""
    elif len(description) > MAX_DESCRIPTION:
        problems.append((path, f"description is {len(description)} characters, over the "
                               f"limit of {MAX_DESCRIPTION} (MAX_DESCRIPTION)"))
        description = ""
    kinds = {}
    for kind in POOL_KINDS:
        given = body.get(kind)
        if given is None:
            kinds[kind] = ResourceSpec(share=default_share, type=default_type)
        else:
            kinds[kind] = _resource_spec(path, kind, given, default_type, default_share, problems)
    return PoolSpec(path=path, description=description, **kinds)


def _type(value: object, path: str, name: str, problems: list) -> PoolType:
    # Only a str is looked up: Enum's own error for a miss is the repr of the value, which
    # for a YAML alias bomb (a few hundred bytes of text) is gigabytes.
    if isinstance(value, str) and value in PoolType._value2member_map_:
        return PoolType(value)
    problems.append((path, f"{name} must be elastic or static, got {_show(value)}"))
    return PoolType.ELASTIC


def _share(value: object, path: str, name: str, problems: list) -> float:
    if _share_weight(value) is None:
        problems.append((path, f"{name} must be a number above 0 and at most {MAX_SHARE}, in "
                               f"steps of 0.001, got {_show(value)}"))
        return 1.0
    return value


def _resource_spec(path: str, kind: str, body: object, default_type: PoolType,
                   default_share: float, problems: list) -> ResourceSpec:
    if not isinstance(body, Mapping):
        problems.append((path, f"{kind}: expected a mapping with reservation/limit/share/type, "
                               f"got {type(body).__name__}"))
        return ResourceSpec(share=default_share, type=default_type)
    for key in body:
        if key not in _KIND_FIELDS:
            problems.append((path, f"{kind}: unknown field {_text(key)!r} (known: "
                                   f"{', '.join(_KIND_FIELDS)})"))
    amounts: dict[str, int | None] = {"reservation": 0, "limit": None}
    for name in ("reservation", "limit"):
        value = body.get(name)
        if value is None:
            continue
        try:
            amounts[name] = _PARSERS[kind](value, f"{kind} {name}")
        except SpecError as err:
            problems.append((path, str(err)))
    share = default_share
    if body.get("share") is not None:
        share = _share(body["share"], path, f"{kind} share", problems)
    ptype = default_type
    if body.get("type") is not None:
        ptype = _type(body["type"], path, f"{kind} type", problems)
    return ResourceSpec(reservation=amounts["reservation"], limit=amounts["limit"],
                        share=share, type=ptype)
