"""Baseline: eager dispatch, earliest deadline first.

The textbook work-conserving scheduler: the moment a GPU is free and anything is queued,
run the model whose oldest request is due first, as large a batch as is queued (up to
the maximum). It drops a request only once its deadline has already passed ("lazy
dropping", Nexus §4.3); a request that will finish late is still served. Under
overload EDF is known to serve the requests most likely to be late first, so lateness
spreads; that, and batches that stay small while GPUs are idle, is what Symphony's
deferred batching is measured against.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

from inference.decisions import Decision, Dispatch, Drop, DropReason, Gpu, ModelSpec, Request
from inference.policies._queue import DeadlineQueue


class EagerEdf:
    name = "eager_edf"

    def __init__(self, models: Sequence[ModelSpec], gpus: Sequence[Gpu]) -> None:
        self._gpu_ids = [g.id for g in gpus]
        self._gheap = [(g.free_at_ns, i) for i, g in enumerate(gpus)]
        heapq.heapify(self._gheap)
        self._names = [m.name for m in models]
        self._index = {m.name: i for i, m in enumerate(models)}
        self._prof = [[m.profile_for(g.gpu_type) for g in gpus] for m in models]
        self._queues = [DeadlineQueue() for _ in models]
        self._queued = 0

    def submit(self, request: Request, now_ns: int) -> None:
        self._queues[self._index[request.model]].push(request.deadline_ns, request.id)
        self._queued += 1

    def step(self, now_ns: int) -> list[Decision]:
        out: list[Decision] = []
        queues = self._queues
        while self._queued and self._gheap[0][0] <= now_ns:
            best = -1
            best_d = 0
            for i, q in enumerate(queues):
                while len(q) and q.head_deadline() < now_ns:
                    out.append(Drop(q.pop_head(), DropReason.EXPIRED))
                    self._queued -= 1
                if len(q) and (best < 0 or q.head_deadline() < best_d):
                    best, best_d = i, q.head_deadline()
            if best < 0:
                break
            _, g = heapq.heappop(self._gheap)
            p = self._prof[best][g]
            ids = queues[best].pop_n(p.max_batch)
            self._queued -= len(ids)
            end = now_ns + p.latency(len(ids))
            out.append(Dispatch(self._gpu_ids[g], self._names[best], ids, now_ns, end))
            heapq.heappush(self._gheap, (end, g))
        return out

    def next_wakeup_ns(self) -> int | None:
        return self._gheap[0][0] if self._queued else None
