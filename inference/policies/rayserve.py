"""Baseline: Ray Serve, power-of-two-choices routing and ``@serve.batch`` with a fixed wait.

Ray Serve's default request router samples two replicas of the deployment and sends the
request to the one with fewer ongoing requests, among replicas under
``max_ongoing_requests`` (docs.ray.io, ``RequestRouterConfig`` /
``PowerOfTwoChoicesRequestRouter``; ray-project/ray#36501); when both are full the
request waits at the router. Inside a replica, ``@serve.batch(max_batch_size,
batch_wait_timeout_s)`` takes the first queued request, then waits up to the timeout for
the batch to fill (``ray.serve.batch``: defaults 10 requests and 10 ms; one batch at a
time, ``max_concurrent_batches=1``). Nothing knows about deadlines: everything is served,
late or not.

Here each model is a deployment whose replicas sit on GPUs in proportion to its load
(``placement.proportional_replicas``: what an operator or Ray's autoscaler would size
from the mean rate; every GPU without rates); replicas on one GPU share it one batch at
a time, FIFO. ``max_batch_size`` is the profile's (as for every policy) and
``max_ongoing_requests`` defaults to twice that, so the cap never limits a batch (a cap
below the batch size does: ray-project/ray#43288, where batches of 256 came out as 101
and 39).
The random choices come from the ``rng`` passed in.
"""

from __future__ import annotations

import heapq
import random
from collections import deque
from collections.abc import Mapping, Sequence

from inference.decisions import Decision, Dispatch, Gpu, ModelSpec, Request
from inference.policies.placement import proportional_replicas
from inference.profile import MS


class RayServe:
    name = "rayserve"

    def __init__(self, models: Sequence[ModelSpec], gpus: Sequence[Gpu], *, rng: random.Random,
                 batch_wait_ns: int = 10 * MS, max_ongoing: int | None = None,
                 rates: Mapping[str, float] | None = None) -> None:
        self._rng = rng
        self._wait = batch_wait_ns
        self._gpu_ids = [g.id for g in gpus]
        self._gpu_free = [g.free_at_ns for g in gpus]
        self._names = [m.name for m in models]
        self._index = {m.name: i for i, m in enumerate(models)}
        hosts = proportional_replicas(self._names, len(gpus), rates)
        self._reps: list[list[int]] = []      # model -> its replica ids
        self._rep_model: list[int] = []       # replica -> model
        self._rep_gpu: list[int] = []         # replica -> GPU
        self._rep_prof = []
        for i, (m, h) in enumerate(zip(models, hosts, strict=True)):
            self._reps.append([])
            for g in h:
                self._reps[i].append(len(self._rep_model))
                self._rep_model.append(i)
                self._rep_gpu.append(g)
                self._rep_prof.append(m.profile_for(gpus[g].gpu_type))
        nrep = len(self._rep_model)
        maxb = max(p.max_batch for p in self._rep_prof)
        self._cap = max_ongoing if max_ongoing is not None else 2 * maxb
        self._rq: list[deque[int]] = [deque() for _ in range(nrep)]
        self._ongoing = [0] * nrep
        self._executing = [0] * nrep
        self._busy_until = [0] * nrep
        self._window: list[int | None] = [None] * nrep
        self._router_q: list[deque[int]] = [deque() for _ in models]
        self._events: list[tuple[int, int]] = []
        self._dirty: set[int] = set()

    def submit(self, request: Request, now_ns: int) -> None:
        i = self._index[request.model]
        if self._router_q[i] or not self._route(i, request.id):
            self._router_q[i].append(request.id)

    def _route(self, i: int, rid: int) -> bool:
        """Power of two choices among model ``i``'s replicas; False if both are full."""
        reps = self._reps[i]
        k = len(reps)
        cap = self._cap
        ongoing = self._ongoing
        if k > 1:
            j1 = self._rng.randrange(k)
            j2 = self._rng.randrange(k - 1)
            if j2 >= j1:
                j2 += 1
            r1, r2 = reps[j1], reps[j2]
            if ongoing[r2] < ongoing[r1]:
                r1, r2 = r2, r1
            r = r1 if ongoing[r1] < cap else (r2 if ongoing[r2] < cap else -1)
        else:
            r = reps[0] if ongoing[reps[0]] < cap else -1
        if r < 0:
            return False
        self._rq[r].append(rid)
        ongoing[r] += 1
        self._dirty.add(r)
        return True

    def step(self, now_ns: int) -> list[Decision]:
        out: list[Decision] = []
        events = self._events
        while events and events[0][0] <= now_ns:
            self._dirty.add(heapq.heappop(events)[1])
        while self._dirty:
            r = self._dirty.pop()
            self._service(r, now_ns, out)
        return out

    def _service(self, r: int, now: int, out: list[Decision]) -> None:
        if self._executing[r] and self._busy_until[r] <= now:
            self._ongoing[r] -= self._executing[r]
            self._executing[r] = 0
            i = self._rep_model[r]
            rq = self._router_q[i]
            while rq and self._route(i, rq[0]):
                rq.popleft()
        q = self._rq[r]
        if self._executing[r] or not q:
            return
        opened = self._window[r]
        if opened is None:
            opened = self._window[r] = now
        i, g = self._rep_model[r], self._rep_gpu[r]
        p = self._rep_prof[r]
        if len(q) < p.max_batch and now < opened + self._wait:
            heapq.heappush(self._events, (opened + self._wait, r))
            return
        ids = tuple(q.popleft() for _ in range(min(len(q), p.max_batch)))
        start = max(now, self._gpu_free[g])
        end = start + p.latency(len(ids))
        self._gpu_free[g] = end
        self._busy_until[r] = end
        self._executing[r] = len(ids)
        self._window[r] = None
        heapq.heappush(self._events, (end, r))
        out.append(Dispatch(self._gpu_ids[g], self._names[i], ids, start, end))

    def next_wakeup_ns(self) -> int | None:
        if self._dirty:
            return None if not self._events else self._events[0][0]
        return self._events[0][0] if self._events else None
