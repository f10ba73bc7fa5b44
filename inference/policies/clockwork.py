"""Baseline: Clockwork's central controller (OSDI'20), latest-start priority.

Clockwork's premise is that DNN inference time is predictable, so one controller can
decide exactly when each batch runs. Its INFER4 scheduler (github malixian/clockwork,
src/clockwork/controller/concurrent_infer_and_load_scheduler.cpp) turns every queued
request and every supported batch size ``b`` into a *strategy* with priority
``deadline - est(b)``: the latest moment that batch could start. Whenever a GPU is free
(or will be within ``schedule_ahead``), it takes the valid strategy with the earliest
priority: the batch of ``b`` requests starting at that request, which must finish by its
deadline. It then "bumps up" to the largest supported batch the queue allows that
still meets that deadline, skips (drops) older requests that cannot be part of it, and
drops requests that can no longer finish at all. So, like ours, it never serves a
request late; unlike ours it is work-conserving (a free GPU never waits) and batch sizes
are the ones the model was compiled for, powers of two by default (Clockwork's model
zoo ships batch 1, 2, 4, 8, 16).

Simplifications, all in Clockwork's favour: every model is resident on every GPU (no
weight loads, so no LOAD actions or cache misses), estimates are exact (the real system
uses the p99 of the last 10 runs), and ``schedule_ahead`` defaults to 0 instead of 10 ms
because the simulator has no control latency to hide.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

from inference.decisions import Decision, Dispatch, Drop, DropReason, Gpu, ModelSpec, Request
from inference.policies._queue import DeadlineQueue


def pow2_sizes(max_batch: int) -> tuple[int, ...]:
    """1, 2, 4, ... up to ``max_batch``: the batch sizes Clockwork's models are compiled for."""
    sizes = []
    b = 1
    while b <= max_batch:
        sizes.append(b)
        b *= 2
    return tuple(sizes)


class Clockwork:
    name = "clockwork"

    def __init__(self, models: Sequence[ModelSpec], gpus: Sequence[Gpu], *,
                 batch_sizes: str = "pow2", schedule_ahead_ns: int = 0) -> None:
        if len({g.gpu_type for g in gpus}) != 1:
            raise ValueError("the Clockwork baseline models one GPU type")
        if batch_sizes not in ("pow2", "all"):
            raise ValueError("batch_sizes is 'pow2' or 'all'")
        if batch_sizes == "all":
            self.name = "clockwork_all"
        gtype = gpus[0].gpu_type
        self._gpu_ids = [g.id for g in gpus]
        self._gheap = [(g.free_at_ns, i) for i, g in enumerate(gpus)]
        heapq.heapify(self._gheap)
        self._ahead = schedule_ahead_ns
        self._names = [m.name for m in models]
        self._index = {m.name: i for i, m in enumerate(models)}
        self._prof = [m.profile_for(gtype) for m in models]
        # Supported sizes, largest first, with their latencies.
        self._sizes = []
        for p in self._prof:
            sizes = pow2_sizes(p.max_batch) if batch_sizes == "pow2" else range(1, p.max_batch + 1)
            self._sizes.append(tuple((b, p.latency(b)) for b in sorted(sizes, reverse=True)))
        self._queues = [DeadlineQueue() for _ in models]
        self._queued = 0

    def submit(self, request: Request, now_ns: int) -> None:
        self._queues[self._index[request.model]].push(request.deadline_ns, request.id)
        self._queued += 1

    def _best_strategy(self, i: int, start: int,
                       out: list[Decision]) -> tuple[int, int, int] | None:
        """Model ``i``'s most urgent valid strategy at ``start``: (priority, skip, batch)."""
        q = self._queues[i]
        lat1 = self._prof[i].latency(1)
        while len(q) and q.head_deadline() < start + lat1:
            out.append(Drop(q.pop_head(), DropReason.DEADLINE_CANNOT_BE_MET))
            self._queued -= 1
        n = len(q)
        if not n:
            return None
        best = None
        for b, lat in self._sizes[i]:
            if b > n:
                continue
            # The first request that can head a batch of b finishing in time...
            skip = q.first_at_least(start + lat)
            if n - skip < b:
                continue  # ...needs b requests from it onwards.
            prio = q.deadline_at(skip) - lat
            if best is None or prio < best[0]:
                best = (prio, skip, b)
        return best

    def step(self, now_ns: int) -> list[Decision]:
        out: list[Decision] = []
        queues = self._queues
        while self._queued and self._gheap[0][0] <= now_ns + self._ahead:
            free_at, g = self._gheap[0]
            start = max(now_ns, free_at)
            best = None
            for i in range(len(queues)):
                if len(queues[i]):
                    s = self._best_strategy(i, start, out)
                    if s is not None and (best is None or s[0] < best[0]):
                        best = (s[0], s[1], s[2], i)
            if best is None:
                break
            _, skip, b, i = best
            q = queues[i]
            deadline = q.deadline_at(skip)
            # Bump up to the largest supported size the queue allows within the deadline.
            avail = len(q) - skip
            for bb, lat in self._sizes[i]:
                if bb <= avail and start + lat <= deadline:
                    b = max(b, bb)
                    break
            for _ in range(skip):
                out.append(Drop(q.pop_head(), DropReason.AT_TARGET_BATCH))
            ids = q.pop_n(b)
            self._queued -= skip + b
            end = start + self._prof[i].latency(b)
            heapq.heapreplace(self._gheap, (end, g))
            out.append(Dispatch(self._gpu_ids[g], self._names[i], ids, start, end))
        return out

    def next_wakeup_ns(self) -> int | None:
        return self._gheap[0][0] - self._ahead if self._queued else None
