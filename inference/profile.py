"""Latency profiles: how long a batch of a model takes on one GPU type.

Every inference scheduler we compare against (Nexus, Clockwork, Symphony) rests on the
same observation: a DNN's batch latency on a given GPU is predictable and close to
linear in the batch size, ``latency(batch) = a + b * batch`` (Nexus §2.2 Eq. 1 writes it
``alpha * b + beta``). Knowing it is what lets a router decide *now* whether a request
can still meet its deadline, instead of finding out afterwards.

Times are integer nanoseconds throughout, so the simulator and the property tests
never compare floats.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

MS = 1_000_000
"""Nanoseconds in a millisecond."""


@dataclass(frozen=True, slots=True)
class LatencyProfile:
    """``latency(batch) = a_ns + b_ns * batch`` for ``1 <= batch <= max_batch``.

    ``a_ns`` is the fixed cost of launching a batch (kernel launches, weights streamed
    through the caches), ``b_ns`` the marginal cost of one more request. Batching pays
    because ``a_ns`` is shared; it costs latency because every request in a batch waits
    for the whole batch.
    """

    a_ns: int
    b_ns: int
    max_batch: int

    def __post_init__(self) -> None:
        if self.a_ns < 0 or self.b_ns < 0:
            raise ValueError(f"latency coefficients must be >= 0, got a={self.a_ns} b={self.b_ns}")
        if self.a_ns + self.b_ns <= 0:
            raise ValueError("a batch of one must take some time (a_ns + b_ns > 0)")
        if self.max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {self.max_batch}")

    def latency(self, batch: int) -> int:
        """Execution time of a batch of ``batch`` requests, in ns."""
        if not 1 <= batch <= self.max_batch:
            raise ValueError(f"batch {batch} outside 1..{self.max_batch}")
        return self.a_ns + self.b_ns * batch

    def max_batch_within(self, budget_ns: int) -> int:
        """Largest batch whose latency fits in ``budget_ns``; 0 if not even one fits.

        Closed form rather than a loop: the router calls this on every decision.
        """
        room = budget_ns - self.a_ns
        if room < self.b_ns:
            return 0
        if self.b_ns == 0:
            return self.max_batch
        return min(self.max_batch, room // self.b_ns)

    def throughput(self, batch: int) -> float:
        """Requests per second one GPU sustains running back-to-back batches of ``batch``."""
        return batch * 1e9 / self.latency(batch)


def slowest(profiles: Iterable[LatencyProfile]) -> LatencyProfile:
    """A profile at least as slow as each given one, for every batch size.

    Used to plan for a pool of mixed GPUs (Symphony's dispatcher merges profiles "by
    slowest" for the same reason): a plan that meets deadlines on the slowest GPU meets
    them on all, and the batch is re-fitted to the real GPU when one is granted.
    """
    ps = list(profiles)
    if not ps:
        raise ValueError("need at least one profile")
    return LatencyProfile(
        a_ns=max(p.a_ns for p in ps),
        b_ns=max(p.b_ns for p in ps),
        max_batch=min(p.max_batch for p in ps),
    )


RESNET50_V100 = LatencyProfile(a_ns=2_400_000, b_ns=1_260_000, max_batch=16)
"""ResNet50 on a V100, fitted to Clockwork's measurements.

Source: Clockwork README (github malixian/clockwork, fork of the MPI-SWS repo): batch 1
3.3 ms, 2 5.3 ms, 4 7.5 ms, 8 12.4 ms; least-squares fit a = 2.40 ms, b = 1.26 ms/req
(shared/research/inference.md §2). ``max_batch=16`` is Clockwork's default largest batch.
"""

SYMPHONY_HARNESS = LatencyProfile(a_ns=5_204_000, b_ns=1_082_000, max_batch=32)
"""The simulated GPU of Symphony's dispatcher benchmark.

Source: github abcdabcd987/nexuslb tools/bench_dispatcher/run_rankmt_example.yaml,
``framework: sleep#1082,5204`` i.e. latency = 5.204 ms + 1.082 ms * batch, SLO 100 ms,
8 GPUs. ``max_batch=32`` is our operator's choice (the largest power of two with
2 * latency <= 100 ms, Nexus's rule for a saturated GPU); the harness does not fix one.
"""

VGG16_TITANX = LatencyProfile(a_ns=1_940_000, b_ns=3_370_000, max_batch=32)
"""VGG16 on a TITAN X, from Nexus's model database.

Source: github uwsaml/nexus tests/data/model_db/profiles (caffe:vgg16:1), fitted to
a = 1.94 ms, b = 3.37 ms/req (shared/research/inference.md §1). ``max_batch=32`` is our
choice; the profile file lists larger batches.
"""

SOURCED_PROFILES: dict[str, LatencyProfile] = {
    "resnet50-v100": RESNET50_V100,
    "symphony": SYMPHONY_HARNESS,
    "vgg16-titanx": VGG16_TITANX,
}
"""The sourced profiles by the names the simulator's ``--profile`` flag accepts."""
