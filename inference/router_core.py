"""Our inference router's decision core: Symphony-style deferred batch scheduling.

Pure: state in, ``(now_ns, arrivals)`` in, ``Dispatch``/``Drop`` decisions out. It reads
no clock, draws no random numbers and does no I/O; the NATS shell (later) and the
simulator (``inference.sim``) feed it time and requests and apply what it returns.

Why defer? A GPU that is free the moment a request arrives could run it at once, in a
batch of one. That is what eager schedulers do, and with many models on many GPUs it
spends much of the GPU on the fixed cost ``a`` of small batches. Symphony (arXiv
2308.07470) instead holds each model's requests as long as the earliest deadline allows,
so the batch grows, and hands out GPUs centrally, most urgent first. The algorithm
follows Symphony's dispatcher (github abcdabcd987/nexuslb, src/nexus/dispatcher/rankmt/
and batch_policy.cpp, batch_size_estimator.cpp); docs/inference.md has the measurements
behind the one place we depart from it (the grant window, step 4).

Per model (a deadline-ordered queue):

1. **Target batch** ``B*`` from the measured arrival rate ``r`` (100 windows of 50 ms):
   the largest ``b`` with ``l(b) + b / r <= SLO`` -- the batch the model can afford to
   wait for and still run within its SLO. (Symphony's ``l(b)(1 + 1/n) <= SLO`` with
   ``n = r l(b) / b`` GPUs is the same inequality.)
2. **Early drop.** Planning against ``t0 = max(now, the time the first GPU frees)``: a
   head request that cannot finish by its deadline in a batch of ``min(queued, B*)`` is
   dropped (Symphony's window drop: keep batches efficient under overload rather than
   shrinking them to rescue requests already too late for an efficient batch). With
   ``drop_policy="strict"`` only requests that cannot finish even alone are dropped.
3. **Batch**: the largest ``b <= min(queued, max_batch)`` that still finishes by the
   earliest deadline ``d_min`` if started at ``t0`` (Symphony's "free lunch").
4. **Timing**: ``frontrun = d_min - l(b + 1)`` is the latest moment at which one more
   request could still join without missing ``d_min``; at once if the batch is full or
   cannot grow. Symphony asks for a GPU exactly then. We let the candidate take a GPU
   that is *already free* from ``frontrun - grant_window`` on (default half the SLO):
   waiting to the last instant is only free if a GPU is certain to be there, and when
   several models reach their last instant while every GPU is busy, the losers must
   shrink or drop. ``grant_window=0`` is Symphony exactly. The candidate stays valid
   until its latest start ``d_min - l(b)``.

Globally: when a candidate's time comes and a GPU is free, the GPU that freed first is
granted; if none is free the candidate is parked, and each GPU that frees goes to the
parked candidate with the earliest latest-start (most urgent). On a grant the batch is
re-formed against the real start time and that GPU's own profile, so no request is ever
started after its latest start: everything dispatched finishes by its deadline.

Cost: ``submit`` is O(1) (O(log n) for an out-of-order deadline); each step touches only
models that changed, with heaps for timers, parked candidates and GPUs. There is no scan
over all models or all requests.
"""

from __future__ import annotations

import heapq
from bisect import bisect_right
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from inference.decisions import Decision, Dispatch, Drop, DropReason, Gpu, ModelSpec, Request
from inference.profile import MS, LatencyProfile, slowest

_DEADLINE = DropReason.DEADLINE_CANNOT_BE_MET
_AT_TARGET = DropReason.AT_TARGET_BATCH


@dataclass(frozen=True, slots=True)
class RouterConfig:
    """Knobs of the core; the defaults are Symphony's except ``grant_window``.

    ``grant_window`` is a fraction of each model's SLO: how long before its frontrun a
    candidate may already take a GPU that is free (0 = Symphony's dispatcher exactly).

    ``dispatch_lead_ns`` is the control latency the shell needs between deciding and the
    batch starting on the worker (Symphony: 100 us control + 50 us per request of
    data); every plan is made as if "now" were ``now + lead``. The simulator uses 0.
    """

    drop_policy: str = "window"
    grant_window: float = 0.5
    dispatch_lead_ns: int = 0
    rate_bucket_ns: int = 50 * MS
    rate_window: int = 100

    def __post_init__(self) -> None:
        if self.drop_policy not in ("window", "strict"):
            raise ValueError("drop_policy is 'window' or 'strict'")
        if not 0 <= self.grant_window < 1:
            raise ValueError("grant_window is a fraction of the SLO in [0, 1)")
        if self.dispatch_lead_ns < 0:
            raise ValueError("dispatch_lead_ns must be >= 0")
        if self.rate_bucket_ns <= 0 or self.rate_window < 1:
            raise ValueError("rate meter needs a positive bucket and window")


def target_batch(profile: LatencyProfile, budget_ns: int, rate_per_s: float | None) -> int:
    """Symphony's target batch size ``B*`` for a model arriving at ``rate_per_s``.

    The largest ``b`` with ``l(b) + b / r <= budget``: waiting for ``b`` requests takes
    about ``b / r``, running them ``l(b)``. Without a rate yet, Symphony starts from the
    largest batch that fits in half the budget (the Nexus rule for a busy GPU).
    Always in ``1..max_batch``.
    """
    if rate_per_s is None:
        b = profile.max_batch_within(budget_ns // 2)
    elif rate_per_s <= 0:
        b = 1
    else:
        per_request = profile.b_ns + 1e9 / rate_per_s
        b = int((budget_ns - profile.a_ns) // per_request)
    return max(1, min(profile.max_batch, b))


class _Model:
    """Mutable per-model state: deadline-ordered queue, rate meter, current candidate.

    Internal to ``RouterCore`` (never handed out). The queue is two parallel lists
    ``dl``/``ids`` sorted by deadline, consumed from ``head`` so dispatch and drop are
    O(1) and arrivals in deadline order (the common case: one SLO per model) append.
    """

    __slots__ = (
        "a",
        "b",
        "bucket",
        "count",
        "dirty",
        "dl",
        "gprof",
        "head",
        "ids",
        "idx",
        "maxb",
        "name",
        "plan",
        "pos",
        "ring",
        "ring_sum",
        "sealed",
        "slo",
        "spec",
        "target",
        "ver",
        "window",
    )

    def __init__(self, idx: int, spec: ModelSpec, plan: LatencyProfile,
                 gprof: list[tuple[int, int, int]], meter_window: int, grant_window: int) -> None:
        self.idx = idx
        self.spec = spec
        self.name = spec.name
        self.slo = spec.slo_ns
        self.plan = plan
        self.a, self.b, self.maxb = plan.a_ns, plan.b_ns, plan.max_batch
        self.gprof = gprof
        self.window = grant_window
        self.dl: list[int] = []
        self.ids: list[int] = []
        self.head = 0
        self.ver = 0
        self.dirty = False
        self.target = target_batch(plan, spec.slo_ns, None)
        self.bucket: int | None = None
        self.count = 0
        self.ring = [0] * meter_window
        self.pos = 0
        self.ring_sum = 0
        self.sealed = 0


class RouterCore:
    """Deadline-aware deferred batching over a pool of GPUs (ours).

    Drive it with ``submit(request, now)`` for each arrival and ``step(now)`` at each
    arrival and at ``next_wakeup_ns()``. Every method is deterministic in (state,
    arguments): the same calls give the same decisions.
    """

    name = "ours"

    def __init__(self, models: Sequence[ModelSpec], gpus: Sequence[Gpu],
                 config: RouterConfig | None = None) -> None:
        if not gpus:
            raise ValueError("need at least one GPU")
        if len({g.id for g in gpus}) != len(gpus):
            raise ValueError("GPU ids must be unique")
        if len({m.name for m in models}) != len(models):
            raise ValueError("model names must be unique")
        self.config = config or RouterConfig()
        self._lead = self.config.dispatch_lead_ns
        self._window_drop = self.config.drop_policy == "window"
        self._bucket_ns = self.config.rate_bucket_ns
        self._gpu_ids = [g.id for g in gpus]
        self._gpu_free = [g.free_at_ns for g in gpus]
        self._gpu_heap = [(g.free_at_ns, i) for i, g in enumerate(gpus)]
        heapq.heapify(self._gpu_heap)
        types = sorted({g.gpu_type for g in gpus})
        self._models: list[_Model] = []
        self._by_name: dict[str, _Model] = {}
        for idx, spec in enumerate(models):
            per_type = {t: spec.profile_for(t) for t in types}
            gprof = [(p.a_ns, p.b_ns, p.max_batch)
                     for p in (per_type[g.gpu_type] for g in gpus)]
            m = _Model(idx, spec, slowest(per_type.values()), gprof, self.config.rate_window,
                       int(self.config.grant_window * spec.slo_ns))
            self._models.append(m)
            self._by_name[spec.name] = m
        self._timers: list[tuple[int, int, int]] = []  # (exec_at, version, model idx)
        self._ready: list[tuple[int, int, int]] = []   # (latest start, version, model idx)
        self._dirty: list[_Model] = []
        self._out: list[Decision] = []
        self._now = -(1 << 62)
        self._submitted = -(1 << 62)

    # ----------------------------------------------------------------- inputs

    def submit(self, request: Request, now_ns: int) -> None:
        """Queue an arriving request. O(1) unless it arrives out of deadline order."""
        m = self._by_name.get(request.model)
        if m is None:
            raise ValueError(f"unknown model {request.model!r}")
        d = request.deadline_ns
        dl = m.dl
        if len(dl) == m.head or d >= dl[-1]:
            dl.append(d)
            m.ids.append(request.id)
        else:
            i = bisect_right(dl, d, m.head)
            dl.insert(i, d)
            m.ids.insert(i, request.id)
        bucket = now_ns // self._bucket_ns
        if bucket != m.bucket:
            self._roll_meter(m, bucket)
        m.count += 1
        if not m.dirty:
            m.dirty = True
            self._dirty.append(m)
        if now_ns > self._submitted:
            self._submitted = now_ns

    def step(self, now_ns: int, arrivals: Iterable[Request] = ()) -> list[Decision]:
        """Everything to do at ``now_ns``: drops and dispatches, in order."""
        for r in arrivals:
            self.submit(r, now_ns)
        if now_ns < self._now:
            raise ValueError(f"time went backwards: {now_ns} < {self._now}")
        self._now = now_ns
        t = now_ns + self._lead
        models = self._models
        ready = self._ready
        timers = self._timers
        gheap = self._gpu_heap

        if self._dirty:
            gmin = gheap[0][0]
            for m in self._dirty:
                m.dirty = False
                self._plan(m, t, gmin)
            self._dirty.clear()

        while timers and timers[0][0] <= t:
            _, ver, idx = heapq.heappop(timers)
            m = models[idx]
            if ver == m.ver:
                self._plan(m, t, gheap[0][0])

        # Grant free GPUs to the most urgent ready candidates.
        while ready and gheap[0][0] <= t:
            _, ver, idx = heapq.heappop(ready)
            m = models[idx]
            if ver != m.ver:
                continue
            self._grant(m, t)

        # Parked candidates whose latest start has passed: re-plan now, which drops
        # what can no longer make it, so the client hears at once rather than later.
        while ready and ready[0][0] < t:
            _, ver, idx = heapq.heappop(ready)
            m = models[idx]
            if ver == m.ver:
                self._plan(m, t, gheap[0][0])

        if len(timers) > 64 + 8 * len(models):
            self._compact_timers()
        out, self._out = self._out, []
        return out

    def next_wakeup_ns(self) -> int | None:
        """When ``step`` next has something to do if nothing arrives; None if never."""
        models = self._models
        timers = self._timers
        while timers:
            top = timers[0]
            if top[1] == models[top[2]].ver:
                break
            heapq.heappop(timers)
        ready = self._ready
        while ready:
            top = ready[0]
            if top[1] == models[top[2]].ver:
                break
            heapq.heappop(ready)
        best = timers[0][0] if timers else None
        if ready:
            w = ready[0][0] + 1
            g = self._gpu_heap[0][0]
            if g < w:
                w = g
            if best is None or w < best:
                best = w
        if self._dirty:  # submitted but not stepped: step now
            w = (self._now if self._now > self._submitted else self._submitted) + self._lead
            if best is None or w < best:
                best = w
        return None if best is None else best - self._lead

    def set_gpu_free_at(self, gpu_id: str, free_at_ns: int) -> None:
        """Correct a GPU's free time from what its worker reports (the shell's job)."""
        i = self._gpu_ids.index(gpu_id)
        self._gpu_free[i] = free_at_ns
        self._gpu_heap = [(f, j) for j, f in enumerate(self._gpu_free)]
        heapq.heapify(self._gpu_heap)

    # ----------------------------------------------------------- introspection

    def queued(self, model: str | None = None) -> int:
        """Requests waiting (for one model, or all)."""
        ms = self._models if model is None else [self._by_name[model]]
        return sum(len(m.dl) - m.head for m in ms)

    def target_batch_size(self, model: str) -> int:
        return self._by_name[model].target

    def gpu_free_at(self) -> dict[str, int]:
        return dict(zip(self._gpu_ids, self._gpu_free, strict=True))

    # --------------------------------------------------------------- internals

    def _roll_meter(self, m: _Model, bucket: int) -> None:
        """Seal the finished 50 ms bucket(s) and refresh the target batch."""
        if m.bucket is not None:
            ring = m.ring
            w = len(ring)
            gap = bucket - m.bucket
            counts = [m.count] + [0] * min(gap - 1, w)
            for c in counts:
                m.ring_sum += c - ring[m.pos]
                ring[m.pos] = c
                m.pos = (m.pos + 1) % w
            m.sealed = min(w, m.sealed + len(counts))
            rate = m.ring_sum * 1e9 / (m.sealed * self._bucket_ns)
            m.target = target_batch(m.plan, m.slo, rate)
        m.bucket = bucket
        m.count = 0

    def _drop_heads(self, m: _Model, t0: int, a: int, b: int) -> int:
        """Drop head requests that cannot make it; returns how many remain queued."""
        dl = m.dl
        h = m.head
        n = len(dl) - h
        tgt = m.target if self._window_drop else 1
        out = self._out
        while n:
            k = n if n < tgt else tgt
            d = dl[h]
            if d >= t0 + a + b * k:
                break
            out.append(Drop(m.ids[h], _DEADLINE if d < t0 + a + b else _AT_TARGET))
            h += 1
            n -= 1
        m.head = h
        if n == 0:
            dl.clear()
            m.ids.clear()
            m.head = 0
        elif h > 4096 and h * 2 > len(dl):
            del dl[:h]
            del m.ids[:h]
            m.head = 0
        return n

    def _plan(self, m: _Model, t: int, gmin: int) -> None:
        """Recompute ``m``'s candidate for a start no earlier than ``t`` and ``gmin``."""
        m.ver += 1
        t0 = t if t > gmin else gmin
        a = m.a
        b = m.b
        dl = m.dl
        n = len(dl) - m.head
        if not n:
            return
        d = dl[m.head]
        tgt = m.target if self._window_drop else 1
        if d < t0 + a + b * (n if n < tgt else tgt):  # someone has to go: slow path
            n = self._drop_heads(m, t0, a, b)
            if not n:
                return
            d = dl[m.head]
        maxb = m.maxb
        bs = n if n < maxb else maxb
        if b:
            fit = (d - t0 - a) // b
            if fit < bs:
                bs = fit
        latest = d - a - b * bs
        if bs < n or bs >= maxb:
            exec_at = t0  # full, or more queued than fit: waiting cannot grow the batch
        else:
            # Could grow: eligible from the last moment one more could still join,
            # less the grant window.
            exec_at = latest - b - m.window
            if exec_at < t0:
                exec_at = t0
        if exec_at <= t:
            heapq.heappush(self._ready, (latest, m.ver, m.idx))
        else:
            heapq.heappush(self._timers, (exec_at, m.ver, m.idx))

    def _grant(self, m: _Model, t: int) -> None:
        """Give the GPU that freed first to ``m``; re-form its batch for that GPU."""
        gheap = self._gpu_heap
        free_at, g = heapq.heappop(gheap)
        t0 = t if t > free_at else free_at
        a, b, maxb = m.gprof[g]
        n = self._drop_heads(m, t0, a, b)
        if n:
            h = m.head
            bs = n if n < maxb else maxb
            if b:
                fit = (m.dl[h] - t0 - a) // b
                if fit < bs:
                    bs = fit
            end = t0 + a + b * bs
            ids = tuple(m.ids[h:h + bs])
            m.head = h + bs
            self._out.append(Dispatch(self._gpu_ids[g], m.name, ids, t0, end))
            free_at = end
            self._gpu_free[g] = end
        heapq.heappush(gheap, (free_at, g))
        self._plan(m, t, gheap[0][0])

    def _compact_timers(self) -> None:
        models = self._models
        self._timers = [e for e in self._timers if e[1] == models[e[2]].ver]
        heapq.heapify(self._timers)
