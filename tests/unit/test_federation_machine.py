"""A hypothesis state machine over three regions: never two live runs of one job.

The model: three regions ``a``, ``b``, ``c``; each job's home keeps its
:class:`~coordinator.federation.epochs.HomeRecord` and each region its
:class:`~coordinator.federation.holder.HolderRecord` per job; a job's *live runs* are
what the holders say (records RUNNING) plus its run at home (started by the home's own
scheduler while LOCAL). Messages sit in a flight list and are delivered in any order
(delayed), dropped, or duplicated; a region may be cut off from the others (its links
down: nothing to or from it is delivered, and every other region sees it unreachable, as
it sees them) and come back. Time moves on; homes tick (``spill.tick``: nominate, time
out, move on from an unreachable nominee, declare a holder lost after ``lost_after``);
holders admit or refuse, give up, let reservations expire, and finish; every region may
resync (holders re-report, homes re-send unanswered nominations).

Invariants, checked after every step:

1. Epochs: a home's epoch for a job never goes down; a holder reserves strictly
   increasing epochs per job; each ``(job, epoch)`` is started at most once, and only
   where the home issued it (the nominee it confirmed, or at home while LOCAL at it).
2. Exactly one run: unless the home has declared a holder of the job lost (``lost_after``
   expired: the one rule that knowingly trades a possible duplicate, in a region cut
   off, for availability), the job has at most one live run at every moment, with
   messages in flight or not.
3. Superseded, not current: of a job's live runs, all but the highest-epoch one have an
   epoch below the home's current epoch, so at most one run believes it is current.

And after *quiescence* (a rule, and at the end: every link restored, every holder
re-reports, every home re-sends, every message delivered, no new decisions), for every
job, lost or not: at most one live run, and it is the home's current placement (HELD by
that region at that epoch, or LOCAL and running at home); no reservation waits for a
confirm; and nothing is lost: every job is DONE, LOCAL, or HELD by a region that runs it.
"""

from __future__ import annotations

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from coordinator.federation import holder as h
from coordinator.federation.epochs import HomeRecord, Phase, finish_local, handle, new_job, resend
from coordinator.federation.holder import Hold, HolderRecord
from coordinator.federation.messages import Confirm, Message, Nominate, Revoke
from coordinator.federation.model import FederationConfig, FedPolicy, RegionView
from coordinator.federation.spill import tick

REGIONS = ("a", "b", "c")
MAX_JOBS = 4
CFG = FederationConfig(nominate_timeout_s=5.0, round_backoff_s=10.0, reserve_ttl_s=20.0)
picks = st.integers(min_value=0, max_value=1 << 16)


def _dst(msg: Message) -> str:
    return msg.holder if isinstance(msg, Nominate | Confirm | Revoke) else msg.home


def _src(msg: Message) -> str:
    return msg.home if isinstance(msg, Nominate | Confirm | Revoke) else msg.holder


class Federation(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0
        self.homes: dict[str, HomeRecord] = {}
        self.holders: dict[tuple[str, str], HolderRecord] = {}  # (region, job)
        self.local: dict[str, int] = {}  # job -> epoch of its live run at home
        self.flight: list[Message] = []
        self.cut_at: dict[str, float] = {}  # region -> when it was cut off
        self.lost: set[str] = set()  # jobs whose holder the home declared lost
        self.issued: dict[tuple[str, int], str] = {}  # (job, epoch) -> where it may run
        self.started: set[tuple[str, int]] = set()
        self.reserved: dict[tuple[str, str], int] = {}  # (region, job) -> last epoch reserved
        self.max_epoch: dict[str, int] = {}

    # --- helpers -----------------------------------------------------------------

    def _link_up(self, x: str, y: str) -> bool:
        return x == y or (x not in self.cut_at and y not in self.cut_at)

    def _last_heard(self, x: str, y: str) -> float | None:
        times = [self.cut_at[r] for r in (x, y) if r in self.cut_at]
        return min(times) if times else None

    def _live(self, job: str) -> list[tuple[str, int]]:
        runs = [(r, rec.epoch) for (r, j), rec in self.holders.items() if j == job and rec.live]
        if job in self.local:
            runs.append((self.homes[job].home, self.local[job]))
        return runs

    def _apply_home(self, job: str, step) -> None:
        before = self.homes[job]
        rec = step.record
        if before.phase is Phase.HELD and rec.phase is Phase.LOCAL and step.send:
            self.lost.add(job)  # only declare_lost leaves HELD with a revoke
        if rec.phase is Phase.NOMINATED and rec.epoch != before.epoch:
            self.issued[(job, rec.epoch)] = rec.region
        if rec.phase is Phase.LOCAL and rec.epoch != before.epoch:
            self.issued[(job, rec.epoch)] = rec.home
        self.homes[job] = rec
        self.flight.extend(step.send)

    def _apply_holder(self, region: str, job: str, step) -> None:
        rec = step.record
        if rec.phase is Hold.RESERVED and self.holders.get((region, job)) != rec:
            last = self.reserved.get((region, job), -1)
            assert rec.epoch > last, f"{region} reserved {job} at {rec.epoch} after {last}"
            self.reserved[(region, job)] = rec.epoch
        if step.start is not None:
            self._start(region, job, step.start)
        self.holders[(region, job)] = rec
        self.flight.extend(step.send)

    def _start(self, region: str, job: str, epoch: int) -> None:
        assert (job, epoch) not in self.started, f"{job} epoch {epoch} started twice"
        assert self.issued.get((job, epoch)) == region, f"{job}@{epoch} started in {region}"
        self.started.add((job, epoch))

    def _deliver(self, msg: Message, fits: bool) -> None:
        if isinstance(msg, Nominate | Confirm | Revoke):
            key = (msg.holder, msg.job)
            self._apply_holder(*key, h.receive(self.holders.get(key), msg, fits, self.now))
        else:
            self._apply_home(msg.job, handle(self.homes[msg.job], msg, self.now))

    # --- rules -------------------------------------------------------------------

    policies = st.tuples(
        st.sampled_from(REGIONS),
        st.permutations(REGIONS),
        st.sampled_from([0.0, 3.0]),
        st.sampled_from([15.0, None, 40.0]),
    )

    @initialize(jobs=st.lists(policies, min_size=1, max_size=3))
    def submit_some(self, jobs):
        for job in jobs:
            self.submit(*job)

    @precondition(lambda self: len(self.homes) < MAX_JOBS)
    @rule(job=policies)
    def submit_one(self, job):
        self.submit(*job)

    def submit(self, home, prefs, after, lost_after):
        job = f"j{len(self.homes)}"
        policy = FedPolicy(regions=tuple(prefs), spill_after=after, lost_after=lost_after)
        self.homes[job] = new_job(job, home, policy, self.now)
        self.issued[(job, 0)] = home
        self.max_epoch[job] = 0

    @rule(
        dt=st.sampled_from([0.0, 25.0, 2.0, 6.0, 0.5]),
        full=st.sets(st.sampled_from(REGIONS), max_size=1),
        stale=st.sets(st.sampled_from(REGIONS), max_size=1),
    )
    def time_passes(self, dt, full, stale):
        """Time moves on and every region's timers fire: each home ticks every job it has
        (``spill.tick``, as the shell's loop does) seeing the regions ``full`` (this job does
        not fit) and ``stale`` as given; each holder gives up reservations past their TTL."""
        self.now += dt
        for job in sorted(self.homes):
            rec = self.homes[job]
            views = [
                RegionView(
                    r,
                    fresh=self._link_up(rec.home, r) and r not in stale,
                    reachable=self._link_up(rec.home, r),
                    fits=r not in full,
                    last_heard=self._last_heard(rec.home, r),
                )
                for r in REGIONS
            ]
            step = tick(rec, views, CFG, self.now, queued=job not in self.local)
            self._apply_home(job, step)
        for key in self._held(Hold.RESERVED):
            self._apply_holder(*key, h.expire_reservation(self.holders[key], CFG, self.now))

    @precondition(lambda self: self.homes)
    @rule(pick=picks)
    def home_runs(self, pick):
        """The home's own scheduler starts a LOCAL job there, or its run there finishes."""
        job = sorted(self.homes)[pick % len(self.homes)]
        rec = self.homes[job]
        if job in self.local:
            del self.local[job]
            self._apply_home(job, finish_local(rec, "succeeded", self.now))
        elif rec.phase is Phase.LOCAL:
            self._start(rec.home, job, rec.epoch)
            self.local[job] = rec.epoch

    @precondition(lambda self: self.flight)
    @rule(picks=st.lists(picks, min_size=1, max_size=4), full=st.booleans())
    def deliver(self, picks, full):
        """Deliver a few messages in flight, each picked anywhere in the list (so in any
        order: delayed), if its link is up."""
        for pick in picks:
            if not self.flight:
                return
            i = pick % len(self.flight)
            msg = self.flight[i]
            if self._link_up(_src(msg), _dst(msg)):
                del self.flight[i]
                self._deliver(msg, not full)

    @precondition(lambda self: self.flight)
    @rule(full=st.booleans())
    def deliver_all(self, full):
        """Deliver, in order, every message whose link is up, and what they cause (the
        protocol running freely between partitions), so deep states are reached."""
        for _ in range(1_000):
            i = next(
                (i for i, m in enumerate(self.flight) if self._link_up(_src(m), _dst(m))), None
            )
            if i is None:
                return
            self._deliver(self.flight.pop(i), not full)
        raise AssertionError("messages never settle")

    @precondition(lambda self: self.flight)
    @rule(pick=picks)
    def drop(self, pick):
        del self.flight[pick % len(self.flight)]

    @precondition(lambda self: self.flight)
    @rule(pick=picks)
    def duplicate(self, pick):
        self.flight.append(self.flight[pick % len(self.flight)])

    def _held(self, *phases: Hold) -> list[tuple[str, str]]:
        return sorted(k for k, rec in self.holders.items() if rec.phase in phases)

    @precondition(lambda self: self._held(Hold.RESERVED, Hold.RUNNING))
    @rule(pick=picks)
    def holder_gives_up(self, pick):
        keys = self._held(Hold.RESERVED, Hold.RUNNING)
        key = keys[pick % len(keys)]
        self._apply_holder(*key, h.give_up(self.holders[key], "gave up", self.now))

    @precondition(lambda self: self._held(Hold.RUNNING))
    @rule(pick=picks)
    def holder_task_finishes(self, pick):
        keys = self._held(Hold.RUNNING)
        key = keys[pick % len(keys)]
        self._apply_holder(*key, h.finish(self.holders[key], "succeeded", self.now))

    @rule(region=st.sampled_from(REGIONS))
    def resync(self, region):
        for (r, _job), rec in sorted(self.holders.items()):
            if r == region:
                self.flight.append(h.report(rec))
        for rec in self.homes.values():
            if rec.home == region:
                self.flight.extend(resend(rec))

    def _holding_regions(self) -> list[str]:
        return sorted(
            {r.region for r in self.homes.values() if r.phase is Phase.HELD} - set(self.cut_at)
        )

    @precondition(lambda self: self._holding_regions())
    @rule(pick=picks)
    def holder_region_lost(self, pick):
        """A region that holds a forwarded job goes dark (the case ``lost_after`` is for)."""
        regions = self._holding_regions()
        self.cut_at[regions[pick % len(regions)]] = self.now

    @precondition(lambda self: self.cut_at)
    @rule(full=st.sets(st.sampled_from(REGIONS), max_size=1))
    def lost_after_expires(self, full):
        """Time moves past every job's ``lost_after`` while some region is dark."""
        self.time_passes(45.0, full, set())

    @rule(region=st.sampled_from(REGIONS))
    def cut_or_restore(self, region):
        """The region loses its links (region loss, as the others see it), or returns."""
        if self.cut_at.pop(region, None) is None:
            self.cut_at[region] = self.now

    @rule()
    def quiesce(self):
        self.cut_at.clear()
        for _ in range(4):
            for region in REGIONS:
                self.resync(region)
            steps = 0
            while self.flight:
                steps += 1
                assert steps < 10_000, "messages never settle"
                self._deliver(self.flight.pop(0), True)
        self._check_settled()

    def _check_settled(self):
        for job, rec in self.homes.items():
            runs = self._live(job)
            assert len(runs) <= 1, f"{job}: live runs {runs} after quiescence ({rec})"
            assert rec.phase is not Phase.NOMINATED, f"{job}: still nominated after quiescence"
            if runs:
                region, epoch = runs[0]
                assert epoch == rec.epoch, f"{job}: live run {runs[0]} is not current ({rec})"
                if region != rec.home:
                    assert rec.phase is Phase.HELD and rec.region == region
            if rec.phase is Phase.HELD:
                held = self.holders.get((rec.region, job))
                assert held is not None and held.epoch == rec.epoch, f"{job}: {rec} vs {held}"
                assert held.phase is Hold.RUNNING, (
                    f"{job}: held by {rec.region}, which {held.phase}"
                )
        assert not self._held(Hold.RESERVED), "a reservation still waits after quiescence"

    def teardown(self):
        self.quiesce()

    # --- invariants --------------------------------------------------------------

    @invariant()
    def epochs_only_grow(self):
        for job, rec in self.homes.items():
            assert rec.epoch >= self.max_epoch[job], f"{job}: epoch went down"
            self.max_epoch[job] = rec.epoch

    @invariant()
    def one_live_run_unless_declared_lost(self):
        for job in self.homes:
            runs = self._live(job)
            if job not in self.lost:
                assert len(runs) <= 1, f"{job}: two live runs {runs}, never declared lost"

    @invariant()
    def all_but_the_highest_run_are_superseded(self):
        for job, rec in self.homes.items():
            epochs = sorted(e for _, e in self._live(job))
            assert len(set(epochs)) == len(epochs), f"{job}: one epoch runs twice"
            assert all(e < rec.epoch for e in epochs[:-1]), f"{job}: {epochs} vs {rec.epoch}"


Federation.TestCase.settings = settings(
    max_examples=200,
    stateful_step_count=100,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestFederation = Federation.TestCase
