"""Baseline: Triton Inference Server's dynamic batcher, default settings.

Triton (docs.nvidia.com/deeplearning/triton-inference-server, "Dynamic Batcher") keeps
one queue per model and, whenever one of the model's instances is free, hands it the
largest batch available up to ``max_batch_size``, with no delay
(``max_queue_delay_microseconds = 0``). The default instance group is one instance per
GPU the model is loaded on; which GPUs is the operator's call, here replicas in
proportion to load (``placement.proportional_replicas``, or every GPU without rates).
Instances of different models on one GPU run independently, and here their batches
share the GPU in submission order (one batch at a time, FIFO). There is no deadline: the
optional queue-timeout policy is off by default, so everything is served, late or not.

The free instance chosen is the one whose GPU frees first (Triton itself just takes the
next idle instance; this only helps it).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from inference.decisions import Decision, Dispatch, Gpu, ModelSpec, Request
from inference.policies._queue import DeadlineQueue
from inference.policies.placement import proportional_replicas


class Triton:
    name = "triton"

    def __init__(self, models: Sequence[ModelSpec], gpus: Sequence[Gpu],
                 rates: Mapping[str, float] | None = None) -> None:
        self._gpu_ids = [g.id for g in gpus]
        self._gpu_free = [g.free_at_ns for g in gpus]
        self._names = [m.name for m in models]
        self._index = {m.name: i for i, m in enumerate(models)}
        self._prof = [[m.profile_for(g.gpu_type) for g in gpus] for m in models]
        self._hosts = proportional_replicas([m.name for m in models], len(gpus), rates)
        self._inst_free = [[gpus[g].free_at_ns for g in h] for h in self._hosts]
        self._min_inst = [min(f) for f in self._inst_free]
        self._queues = [DeadlineQueue() for _ in models]  # keyed by arrival: FIFO
        self._work: set[int] = set()

    def submit(self, request: Request, now_ns: int) -> None:
        i = self._index[request.model]
        self._queues[i].push(request.arrival_ns, request.id)
        self._work.add(i)

    def step(self, now_ns: int) -> list[Decision]:
        out: list[Decision] = []
        ready = [i for i in self._work if self._min_inst[i] <= now_ns]
        ready.sort(key=lambda i: (self._queues[i].head_deadline(), i))  # oldest head first
        gpu_free = self._gpu_free
        for i in ready:
            q = self._queues[i]
            inst = self._inst_free[i]
            hosts = self._hosts[i]
            while len(q):
                k = -1
                for j, f in enumerate(inst):
                    if f <= now_ns and (k < 0 or gpu_free[hosts[j]] < gpu_free[hosts[k]]):
                        k = j
                if k < 0:
                    break
                g = hosts[k]
                p = self._prof[i][g]
                ids = q.pop_n(p.max_batch)
                start = max(now_ns, gpu_free[g])
                end = start + p.latency(len(ids))
                gpu_free[g] = end
                inst[k] = end
                out.append(Dispatch(self._gpu_ids[g], self._names[i], ids, start, end))
            self._min_inst[i] = min(inst)
            if not len(q):
                self._work.discard(i)
        return out

    def next_wakeup_ns(self) -> int | None:
        if not self._work:
            return None
        return min(self._min_inst[i] for i in self._work)
