"""A site agent's runs: its ledger rows, and its in-place restarts while cut off.

Why it exists: an agent of an edge site (common to issue 21: a NATS leafnode that may
lose its region for minutes) cannot wait for the region to decide a retry: while the
site link says the region is unreachable (`SiteUplink` on `subjects.site_uplink`), a
batch task whose process exits non-zero is started again in place, same task and
attempt, run n+1, after a short backoff, while its restart policy allows
(`Assignment.retries_left`, each in-place run counted against it). Only the attempt's
final outcome is reported, saying how often it was restarted, so the region folds one
outcome per attempt. While the region is reachable nothing changes: the region decides.

Every run, restarted or not, is written to the agent's ledger (`TaskStore.runs`, see
agent/ledger.py) at its start and end. The decisions are the pure functions
`should_restart` and `backoff_s`; `RunKeeper` is the thin shell the agent calls.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from agent.executor import ExecError, ExecSpec, ExitStatus, ProcessHandle
from agent.ledger import Run
from agent.store import TaskStore
from mesh import subjects
from mesh.edgeschema import WireError, decode_uplink

__all__ = ["RunKeeper", "Uplink", "backoff_s", "should_restart"]

log = logging.getLogger("mesh.agent")

BACKOFF_S = 0.5  # before the first in-place restart; doubled per restart up to the cap
MAX_BACKOFF_S = 10.0


def should_restart(
    *, cut_off: bool, status: ExitStatus, retries_left: int, runs: int, stopping: bool
) -> bool:
    """Whether a run that just ended is started again in place: only while cut off, only
    a process that exited non-zero by itself (not killed, not over its max run time:
    those are the region's or the agent's decisions), only while the attempt's retries
    are not spent (`runs` counts the runs of this attempt so far, the first included),
    never once the agent was told to stop it.

    >>> failed = ExitStatus(1, None, False, False, "")
    >>> should_restart(cut_off=True, status=failed, retries_left=3, runs=1, stopping=False)
    True
    >>> should_restart(cut_off=True, status=failed, retries_left=3, runs=4, stopping=False)
    False
    >>> should_restart(cut_off=False, status=failed, retries_left=3, runs=1, stopping=False)
    False
    """
    exited_non_zero = status.exit_code not in (None, 0)
    by_itself = not (status.killed or status.timed_out or status.reason)
    return cut_off and not stopping and exited_non_zero and by_itself and runs <= retries_left


def backoff_s(runs: int) -> float:
    """The pause before run `runs + 1`: short (a cut-off site has nothing better to do
    with the node), growing so a command that always fails does not spin.

    >>> [backoff_s(n) for n in (1, 2, 3, 10)]
    [0.5, 1.0, 2.0, 10.0]
    """
    return min(MAX_BACKOFF_S, BACKOFF_S * 2 ** max(0, runs - 1))


@dataclass(frozen=True, slots=True)
class Rerun:
    """How a run (and its in-place restarts) ended: the last status, and how many
    times it was restarted in place."""

    status: ExitStatus
    handle: ProcessHandle
    restarts: int = 0

    @property
    def message(self) -> str:
        if not self.restarts:
            return ""
        times = "time" if self.restarts == 1 else "times"
        return f"restarted in place {self.restarts} {times} while cut off"


class Uplink:
    """What the site link last said about the region (`SiteUplink`), for a site agent.

    Reachable until told otherwise: an agent with no site, or one whose site link has
    not spoken yet, leaves every retry to the region as before. `on_back` is called
    when the region is reachable again (the agent kicks its assignment feed: a long
    poll sent while cut may never be answered)."""

    def __init__(self, on_back: Callable[[], None] | None = None) -> None:
        self.reachable = True
        self.since = 0.0
        self.on_back = on_back
        self._sub = None

    async def start(self, nc, region: str, site: str) -> None:
        if site:
            self._sub = await nc.subscribe(subjects.site_uplink(region, site), cb=self._heard)

    async def stop(self) -> None:
        if self._sub is not None:
            try:
                await self._sub.unsubscribe()
            except Exception as exc:  # the connection may be closing already
                log.debug("uplink unsubscribe: %s", exc)
            self._sub = None

    async def _heard(self, msg) -> None:
        try:
            up = decode_uplink(msg.data)
        except WireError as exc:
            log.warning("site uplink message dropped: %s", exc)
            return
        back = up.reachable and not self.reachable
        if up.reachable != self.reachable:
            log.info("site uplink: region %s", "reachable" if up.reachable else "unreachable")
        self.reachable, self.since = up.reachable, up.since
        if back and self.on_back is not None:
            self.on_back()


class Agentish(Protocol):
    """What RunKeeper uses of the agent (agent/service.py's Agent)."""

    node_id: str
    store: TaskStore
    handles: dict[tuple[str, int], ProcessHandle]
    killing: set[tuple[str, int]]
    executor: object


class RunKeeper:
    """The agent's ledger writes and in-place restarts (a few hook lines in the agent).

    Ledger writes that fail (a full disk) are logged and do not stop the task: the
    ledger is evidence, the task store is what keeps tasks from running twice."""

    def __init__(self, agent: Agentish) -> None:
        self.agent = agent
        self.uplink = Uplink()
        # what a restart needs, per running (task, attempt) this agent launched
        self._specs: dict[tuple[str, int], tuple[ExecSpec, int]] = {}

    def launched(self, key: tuple[str, int], exec_spec: ExecSpec, retries_left: int) -> None:
        self._specs[key] = (exec_spec, retries_left)

    async def started(self, task_id: str, attempt: int, start: float, run: int = 1) -> None:
        """`start`: the agent's clock as it launched the run. Not the process's
        create_time: that is boot time (whole seconds) plus clock ticks, up to a second
        early, and a run restarted 0.5 s after its predecessor ended read as overlapping
        it (seen in CI)."""
        await self._write(
            self.agent.store.run_started(Run(task_id, attempt, run, self.agent.node_id, start))
        )

    async def ended(self, task_id: str, attempt: int, outcome: str) -> None:
        """Close the attempt's latest open run (a re-adopted process continues the run
        its agent started before it restarted)."""
        last = await self._read(task_id, attempt)
        if last is not None and last.end is None:
            await self._write(
                self.agent.store.run_ended(task_id, attempt, last.run, time.time(), outcome)
            )

    async def readopted(self, task_id: str, attempt: int, start: float) -> None:
        """A process found alive after an agent restart: its run stays open, and one the
        agent died before recording is recorded now (from the process's start time)."""
        last = await self._read(task_id, attempt)
        if last is None or last.end is not None:
            await self.started(task_id, attempt, start, 1 if last is None else last.run + 1)

    async def rerun(self, key: tuple[str, int], handle: ProcessHandle, status: ExitStatus) -> Rerun:
        """Restart the run in place while `should_restart` says so; the final status.
        A process re-adopted after an agent restart is not restarted (its spec is not
        kept): its outcome goes to the region as before."""
        restarts = 0
        exec_spec, retries_left = self._specs.pop(key, (None, 0))
        if exec_spec is None:
            return Rerun(status, handle)
        task_id, attempt = key
        while True:
            last = await self._read(task_id, attempt)
            runs = last.run if last is not None else 1
            if not should_restart(
                cut_off=not self.uplink.reachable,
                status=status,
                retries_left=retries_left,
                runs=runs,
                stopping=key in self.agent.killing,
            ):
                return Rerun(status, handle, restarts)
            await self.ended(task_id, attempt, "FAILED")
            await asyncio.sleep(backoff_s(runs))
            if key in self.agent.killing:  # killed during the backoff: nothing runs
                return Rerun(ExitStatus(None, None, True, False, ""), handle, restarts)
            launched_at = time.time()
            try:
                handle = await self.agent.executor.start(exec_spec)
            except ExecError as exc:
                log.warning("%s#%d: in-place restart failed: %s", task_id, attempt, exc)
                return Rerun(status, handle, restarts)
            restarts += 1
            self.agent.handles[key] = handle
            await self.started(task_id, attempt, launched_at, runs + 1)
            log.info(
                "%s#%d restarted in place (run %d): the region is unreachable",
                task_id,
                attempt,
                runs + 1,
            )
            status = await self.agent.executor.wait(handle)

    async def _read(self, task_id: str, attempt: int) -> Run | None:
        try:
            return await self.agent.store.last_run(task_id, attempt)
        except Exception as exc:
            log.warning("ledger not readable: %s", exc)
            return None

    async def _write(self, op) -> None:
        try:
            await op
        except Exception as exc:
            log.warning("ledger not written: %s", exc)
