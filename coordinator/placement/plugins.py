"""Placement plugins: filters say which nodes can take a task, scores rank the rest.

Every plugin is vectorised over a subset of nodes (`idx`, an index array or a slice of the
snapshot), so the core evaluates a whole region with a few numpy operations and
refreshes just the nodes a placement changed with the same code; a few changed nodes
are refreshed one at a time by the dynamic plugins' scalar twins (`*_one`, over a
`NodeRow`), which give the same numbers to the bit (a test holds them equal). A
request's class (`Shape`: what it asks for and where it may go) is what plugins see;
tasks of one shape share their filter and score arrays.

Scores are each about 0..1 and weighted by the profile. The GPU score is Alnair's idea,
utilisation-driven packing, in floating point (Alnair's own divides integers and is
always 0): a fractional task goes to the GPU it fills most, as long as measured
utilisation leaves room for its share; whole-GPU tasks only take GPUs no one shares, and
CPU-only tasks keep off GPU nodes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from operator import ge

import numpy as np

from coordinator.partitions.config import BATCH
from coordinator.placement.snapshot import (
    GPU,
    GPU_MEMORY,
    ISOLATION_LEVEL,
    KINDS,
    WHOLE,
    NodeRow,
    Working,
)
from coordinator.ports import describe as describe_ports
from coordinator.ports import range_size
from workloads.quantity import format_bytes, format_gpu
from workloads.resources import gpu_share

OVERLOAD_PENALTY = 2.0  # per unit of measured utilisation beyond a whole GPU
_NO_ROOM = float("-inf")
Index = np.ndarray | slice  # a set of node rows; a slice (one node, or all) is a cheap view


@dataclass(frozen=True, slots=True)
class Shape:
    """What one task asks for and which nodes may hold it: the cache key for its arrays.

    Its hash is computed once: a round looks a shape up in several maps per task, and
    hashing its nested tuples (and comparing fields) each time was about a fifth of
    placing a 100,000-task backlog."""

    resources: tuple[int, int, int, int, int]  # Resources.KINDS order
    simulated: bool = False
    labels: tuple[tuple[str, str], ...] = ()
    isolation: str = "none"
    partition: str = BATCH  # the partition whose nodes may take it (docs/partitions.md)
    ports: int = 0  # named ports it is given (coordinator/ports.py)
    # Derived once, as the hash is: plugins read them per node refreshed.
    _hash: int = field(init=False, repr=False, compare=False)
    gpu: int = field(init=False, repr=False, compare=False)
    fractional: bool = field(init=False, repr=False, compare=False)
    whole_gpus: int = field(init=False, repr=False, compare=False)
    gpu_memory_each: int = field(init=False, repr=False, compare=False)  # asked of each GPU
    level: int = field(init=False, repr=False, compare=False)  # isolation's ISOLATION_LEVEL

    def __post_init__(self) -> None:
        fields = (
            self.resources,
            self.simulated,
            self.labels,
            self.isolation,
            self.partition,
            self.ports,
        )
        gpu = self.resources[GPU]
        fractional = 0 < gpu < WHOLE
        whole = gpu // WHOLE if gpu >= WHOLE else 0
        each = gpu_share(gpu, self.resources[GPU_MEMORY], 1 if fractional else whole)[1]
        for name, value in (
            ("_hash", hash(fields)),
            ("gpu", gpu),
            ("fractional", fractional),
            ("whole_gpus", whole),
            ("gpu_memory_each", each),
            ("level", ISOLATION_LEVEL[self.isolation]),
        ):
            object.__setattr__(self, name, value)

    def __hash__(self) -> int:
        return self._hash


@lru_cache(maxsize=4096)
def request(shape: Shape) -> np.ndarray:
    return np.array(shape.resources, dtype=np.int64)


# --------------------------------------------------------------------------- GPU slots


def gpu_fits(w: Working, idx: Index, shape: Shape) -> np.ndarray:
    """(nodes, G) mask: which GPUs of those nodes could hold (a share of) the task."""
    s = w.snap
    ok = s.g_valid[idx] & (s.g_level[idx] >= shape.level)
    ok &= w.g_free_mem[idx] >= shape.gpu_memory_each
    if shape.fractional:
        ok &= w.g_alloc[idx] + shape.gpu <= WHOLE
    else:
        ok &= w.g_alloc[idx] == 0  # whole GPUs are never shared
    return ok


def gpu_fits_one(r: NodeRow, shape: Shape) -> list[bool]:
    level, mem, gpu = shape.level, shape.gpu_memory_each, shape.gpu
    if shape.fractional:
        return [
            v and lv >= level and m >= mem and a + gpu <= WHOLE
            for v, lv, m, a in zip(r.g_valid, r.g_level, r.g_free_mem, r.g_alloc, strict=True)
        ]
    return [
        v and lv >= level and m >= mem and a == 0
        for v, lv, m, a in zip(r.g_valid, r.g_level, r.g_free_mem, r.g_alloc, strict=True)
    ]


def gpu_slot_scores(w: Working, idx: Index, shape: Shape) -> np.ndarray:
    """(nodes, G) score per GPU for a fractional task: how full it ends up (pack the
    fractions, keep whole GPUs whole), less a penalty when measured utilisation plus the
    task's share would pass 100%. -inf where the task does not fit."""
    share = shape.gpu / WHOLE
    after = (w.g_alloc[idx] + shape.gpu) / WHOLE
    over = np.maximum(w.snap.g_util[idx] + share - 1.0, 0.0)
    score = after - OVERLOAD_PENALTY * over
    return np.where(gpu_fits(w, idx, shape), score, -np.inf)


def gpu_slot_scores_one(r: NodeRow, shape: Shape) -> list[float]:
    gpu = shape.gpu
    share = gpu / WHOLE
    return [
        (a + gpu) / WHOLE - OVERLOAD_PENALTY * (x if (x := u + share - 1.0) > 0.0 else 0.0)
        if ok
        else _NO_ROOM
        for ok, a, u in zip(gpu_fits_one(r, shape), r.g_alloc, r.g_util, strict=True)
    ]


def choose_gpus(w: Working, i: int, shape: Shape) -> tuple[int, ...]:
    """The GPU slots of node `i` the task gets (the node passed the filters)."""
    idx = slice(i, i + 1)
    if shape.fractional:
        return (int(np.argmax(gpu_slot_scores(w, idx, shape)[0])),)
    fits = gpu_fits(w, idx, shape)[0]
    slots = np.flatnonzero(fits)
    # The least busy free GPUs, by measured utilisation; ties by index.
    order = slots[np.argsort(w.snap.g_util[i, slots], kind="stable")]
    return tuple(int(j) for j in order[: shape.whole_gpus])


def book(w: Working, i: int, shape: Shape, slots: tuple[int, ...], sign: int = 1) -> None:
    """Take (sign 1) or give back (sign -1) one task of `shape` on node `i` and its GPU
    `slots`: the one way a placement changes what is free, for the core and the commit."""
    w.free[i] -= sign * request(shape)
    if shape.ports:
        w.ports_free[i] -= sign * shape.ports
    each = shape.gpu if shape.fractional else WHOLE
    for j in slots:
        w.g_alloc[i, j] += sign * each
        w.g_free_mem[i, j] -= sign * shape.gpu_memory_each


def copies_fitting(w: Working, shape: Shape) -> np.ndarray:
    """Per node, how many more tasks of this shape its free node-level resources hold
    (GPU slots aside): what `pack` uses to open the roomiest node first."""
    req = request(shape)
    asked = req > 0
    if not asked.any():
        return np.full(len(w.snap), np.iinfo(np.int64).max // 2)
    return (np.maximum(w.free[:, asked], 0) // req[asked]).min(axis=1)


# --------------------------------------------------------------------------- filters


@dataclass(frozen=True, slots=True)
class Filter:
    """`dynamic` filters depend on what is free and are re-run on nodes a placement
    changed; static ones depend only on the snapshot and run once per shape."""

    name: str
    applies: Callable[[Shape], bool]
    ok: Callable[[Working, Index, Shape], np.ndarray]
    reasons: Callable[[Working, np.ndarray, Shape], dict[str, int]]  # over rejected nodes
    dynamic: bool
    ok_one: Callable[[NodeRow, Shape], bool] | None = None  # `ok` for one node (dynamic)
    # Depends on what agents measure, not on what a node is: left out when judging
    # whether a job can ever fit the region (coordinator/fitting.py).
    measured: bool = False


def _sim_ok(w: Working, idx: Index, shape: Shape) -> np.ndarray:
    return w.snap.simulated[idx] == shape.simulated


def _sim_reason(w: Working, idx: np.ndarray, shape: Shape) -> dict[str, int]:
    why = (
        "real node (task is simulated)"
        if shape.simulated
        else "simulated node (task runs a real command)"
    )
    return {why: len(idx)}


def _partition_ok(w: Working, idx: Index, shape: Shape) -> np.ndarray:
    return w.snap.partition_mask(shape.partition)[idx]


def _partition_reason(w: Working, idx: np.ndarray, shape: Shape) -> dict[str, int]:
    out: dict[str, int] = {}
    nodes = w.snap.nodes
    for i in idx.tolist():
        x = nodes[i]
        why = (
            "draining (moving between partitions)"
            if x.draining and x.partition == shape.partition
            else f"partition {x.partition}≠{shape.partition}"
        )
        out[why] = out.get(why, 0) + 1
    return out


def _busy_ok(w: Working, idx: Index, shape: Shape) -> np.ndarray:
    limit = w.snap.busy_limit[idx]
    return (limit == 0.0) | (w.snap.load[idx] < limit)


def _busy_reason(w: Working, idx: np.ndarray, shape: Shape) -> dict[str, int]:
    return {"busy: measured CPU at its oversubscribed partition's busy line": len(idx)}


def _labels_ok(w: Working, idx: Index, shape: Shape) -> np.ndarray:
    ok = w.snap.label_mask(*shape.labels[0])[idx]
    for key, value in shape.labels[1:]:
        ok = ok & w.snap.label_mask(key, value)[idx]
    return ok


def _labels_reason(w: Working, idx: np.ndarray, shape: Shape) -> dict[str, int]:
    out: dict[str, int] = {}
    left = idx
    for key, value in shape.labels:
        bad = ~w.snap.label_mask(key, value)[left]
        if bad.any():
            out[f"label {key}≠{value}"] = int(bad.sum())
        left = left[~bad]
    return out


def _fit_ok(w: Working, idx: Index, shape: Shape) -> np.ndarray:
    return (w.free[idx] >= request(shape)).all(axis=1)


def _fit_ok_one(r: NodeRow, shape: Shape) -> bool:
    return all(map(ge, r.free, shape.resources))


def _fit_reason(w: Working, idx: np.ndarray, shape: Shape) -> dict[str, int]:
    first_short = np.argmax(w.free[idx] < request(shape), axis=1)
    counts = np.bincount(first_short, minlength=len(KINDS))
    return {"insufficient " + KINDS[k]: int(n) for k, n in enumerate(counts) if n}


def _isolation_ok(w: Working, idx: Index, shape: Shape) -> np.ndarray:
    s = w.snap
    return (s.g_valid[idx] & (s.g_level[idx] >= shape.level)).any(axis=1)


def _isolation_reason(w: Working, idx: np.ndarray, shape: Shape) -> dict[str, int]:
    return {f"no GPU delivering {shape.isolation} isolation": len(idx)}


def _gpu_ok(w: Working, idx: Index, shape: Shape) -> np.ndarray:
    fits = gpu_fits(w, idx, shape)
    if shape.fractional:
        return fits.any(axis=1)
    return fits.sum(axis=1) >= shape.whole_gpus


def _gpu_ok_one(r: NodeRow, shape: Shape) -> bool:
    fits = gpu_fits_one(r, shape)
    if shape.fractional:
        return any(fits)
    return sum(fits) >= shape.whole_gpus


def _gpu_reason(w: Working, idx: np.ndarray, shape: Shape) -> dict[str, int]:
    mem = f", {format_bytes(shape.gpu_memory_each)} each" if shape.gpu_memory_each else ""
    if shape.fractional:
        why = f"no single GPU with {format_gpu(shape.gpu)} GPU{mem} free"
    else:
        why = f"fewer than {shape.whole_gpus} unshared GPUs{mem} free"
    return {why: len(idx)}


def _ports_offered_ok(w: Working, idx: Index, shape: Shape) -> np.ndarray:
    return w.snap.port_size[idx] >= shape.ports


def _ports_reason(w: Working, idx: np.ndarray, shape: Shape) -> dict[str, int]:
    out: dict[str, int] = {}
    nodes = w.snap.nodes
    for i in idx.tolist():
        rng = nodes[i].port_range
        size = range_size(rng)
        short = 0 < size < shape.ports
        why = f"offers only {size} ports" if short else describe_ports(rng)
        out[why] = out.get(why, 0) + 1
    return out


def _ports_free_ok(w: Working, idx: Index, shape: Shape) -> np.ndarray:
    return w.ports_free[idx] >= shape.ports


def _ports_free_ok_one(r: NodeRow, shape: Shape) -> bool:
    return r.ports_free >= shape.ports


FILTERS: tuple[Filter, ...] = (
    Filter("simulation", lambda s: True, _sim_ok, _sim_reason, False),
    Filter("partition", lambda s: True, _partition_ok, _partition_reason, False),
    Filter("busy", lambda s: True, _busy_ok, _busy_reason, False, measured=True),
    Filter("labels", lambda s: bool(s.labels), _labels_ok, _labels_reason, False),
    Filter("resources", lambda s: True, _fit_ok, _fit_reason, True, _fit_ok_one),
    Filter(
        "gpu_isolation",
        lambda s: s.gpu > 0 and s.level > 0,
        _isolation_ok,
        _isolation_reason,
        False,
    ),
    Filter("gpu_fit", lambda s: s.gpu > 0, _gpu_ok, _gpu_reason, True, _gpu_ok_one),
    # A node with no port range, or too small a one, can never take a task asking ports;
    # one whose holding tasks took them cannot now (so it is left out of `idle`).
    Filter("ports", lambda s: s.ports > 0, _ports_offered_ok, _ports_reason, False),
    Filter(
        "ports_free",
        lambda s: s.ports > 0,
        _ports_free_ok,
        _ports_reason,
        True,
        _ports_free_ok_one,
        measured=True,
    ),
)


# --------------------------------------------------------------------------- scores


def binpack(w: Working, idx: Index, shape: Shape) -> np.ndarray:
    """1 minus the mean fraction of capacity left free after the task: tight fits win,
    so large holes stay open for large tasks."""
    s = w.snap
    left = (w.free[idx] - request(shape)) * s.inv_cap[idx]
    return 1.0 - left.sum(axis=1) * s.inv_kinds[idx]


def binpack_one(r: NodeRow, shape: Shape) -> float:
    left = 0.0  # summed in numpy's order for five values, so the result is the same
    for f, q, c in zip(r.free, shape.resources, r.inv_cap, strict=True):
        left += (f - q) * c
    return 1.0 - left * r.inv_kinds


def gpu_fit(w: Working, idx: Index, shape: Shape) -> np.ndarray:
    if shape.fractional:
        best = gpu_slot_scores(w, idx, shape).max(axis=1, initial=-np.inf)
        return np.where(np.isfinite(best), best, 0.0)
    gpus = w.snap.gpu_count[idx]
    if shape.whole_gpus:
        # Best fit on unshared GPUs: the node left with the fewest free whole GPUs.
        free_whole = gpu_fits(w, idx, shape).sum(axis=1)
        return 1.0 - (free_whole - shape.whole_gpus) / np.maximum(gpus, 1)
    return np.where(gpus > 0, -1.0, 0.0)  # CPU work keeps off GPU nodes


def gpu_fit_one(r: NodeRow, shape: Shape) -> float:
    if shape.fractional:
        best = max(gpu_slot_scores_one(r, shape), default=_NO_ROOM)
        return best if best != _NO_ROOM else 0.0
    if shape.whole_gpus:
        free_whole = sum(gpu_fits_one(r, shape))
        return 1.0 - (free_whole - shape.whole_gpus) / max(r.gpu_count, 1)
    return -1.0 if r.gpu_count > 0 else 0.0


def low_load(w: Working, idx: Index, shape: Shape) -> np.ndarray:
    return 1.0 - w.snap.load[idx]


@dataclass(frozen=True, slots=True)
class Score:
    name: str
    fn: Callable[[Working, Index, Shape], np.ndarray]
    dynamic: Callable[[Shape], bool]  # does it change as tasks are placed?
    one: Callable[[NodeRow, Shape], float] | None = None  # `fn` for one node (dynamic)


SCORES: Mapping[str, Score] = {
    "binpack": Score("binpack", binpack, lambda s: True, binpack_one),
    "gpu_fit": Score("gpu_fit", gpu_fit, lambda s: s.gpu > 0, gpu_fit_one),
    "low_load": Score("low_load", low_load, lambda s: False),
}


@dataclass(frozen=True, slots=True)
class Profile:
    """Which scores count and how much. Filters always all apply: they are correctness."""

    name: str
    weights: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        unknown = set(self.weights) - set(SCORES)
        if unknown:
            raise ValueError(f"unknown score plugins {sorted(unknown)}; known: {sorted(SCORES)}")


PROFILES = {
    "default": Profile("default", {"binpack": 1.0, "gpu_fit": 2.0, "low_load": 0.25}),
    # Balanced load (least allocated first) for latency-sensitive services.
    "balanced": Profile("balanced", {"binpack": -1.0, "gpu_fit": 2.0, "low_load": 1.0}),
}


@dataclass(frozen=True, slots=True)
class Pipeline:
    """The plugins that apply to one shape under one profile, split into the static half
    (run once per shape) and the dynamic half (re-run on nodes that changed)."""

    filters: tuple[Callable[[Working, Index, Shape], np.ndarray], ...]
    scores: tuple[tuple[float, Callable[[Working, Index, Shape], np.ndarray]], ...]
    # The same plugins' scalar twins, for one node; None where one has no twin.
    filters_one: tuple[Callable[[NodeRow, Shape], bool], ...] | None = None
    scores_one: tuple[tuple[float, Callable[[NodeRow, Shape], float]], ...] | None = None

    def run(self, w: Working, idx: Index, shape: Shape) -> tuple[np.ndarray, np.ndarray]:
        """(ok, score) over nodes `idx`. Called per node a placement changed, so it makes
        no array it does not need (a filter's result may be a view: never changed)."""
        first, *rest = self.filters  # each half has one that always applies
        ok = first(w, idx, shape)
        for f in rest:
            ok = ok & f(w, idx, shape)
        total = None
        for weight, fn in self.scores:
            term = fn(w, idx, shape)
            if weight != 1.0:
                term = weight * term
            total = term if total is None else total + term
        return ok, np.zeros(len(ok)) if total is None else total

    @property
    def scalar(self) -> bool:
        return self.filters_one is not None and self.scores_one is not None

    def fits_one(self, r: NodeRow, shape: Shape) -> bool:
        """`run`'s ok for one node (needs `scalar`)."""
        return all(f(r, shape) for f in self.filters_one)

    def run_one(self, r: NodeRow, shape: Shape) -> float | None:
        """`run`'s score for one node, the same to the bit; None where `run` says not ok
        (needs `scalar`)."""
        if not self.fits_one(r, shape):
            return None
        total = 0.0
        for k, (weight, fn) in enumerate(self.scores_one):
            term = fn(r, shape)
            if weight != 1.0:
                term = weight * term
            total = term if k == 0 else total + term
        return total


def pipeline(shape: Shape, profile: Profile, dynamic: bool) -> Pipeline:
    filters = [f for f in FILTERS if f.dynamic == dynamic and f.applies(shape)]
    scores = [
        (weight, SCORES[name])
        for name, weight in profile.weights.items()
        if weight and SCORES[name].dynamic(shape) == dynamic
    ]
    filters_one = tuple(f.ok_one for f in filters)
    scores_one = tuple((weight, score.one) for weight, score in scores)
    return Pipeline(
        tuple(f.ok for f in filters),
        tuple((weight, score.fn) for weight, score in scores),
        None if None in filters_one else filters_one,
        None if any(fn is None for _, fn in scores_one) else scores_one,
    )


def rejections(w: Working, shape: Shape, idle: bool = False) -> dict[str, int]:
    """Per reason, how many nodes the filters turn away (each node counted once, by the
    first filter that rejects it, in pipeline order). `idle`: the nodes as if idle, so
    without the filters on what agents measure."""
    counts: dict[str, int] = {}
    alive = np.arange(len(w.snap))
    for f in FILTERS:
        if not f.applies(shape) or not len(alive) or (idle and f.measured):
            continue
        ok = f.ok(w, alive, shape)
        rejected = alive[~ok]
        if len(rejected):
            for why, n in f.reasons(w, rejected, shape).items():
                counts[why] = counts.get(why, 0) + n
        alive = alive[ok]
    return counts
