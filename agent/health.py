"""Service replicas' health checks on a real agent.

The coordinator counts a replica with a health check as available only once it is
healthy (coordinator/services.py). The agent runs the check (the spec's `health`,
sent in the assignment's `TaskSpec.health`) every `interval_s` beside the replica, as
its user, with its env and work dir (`ProcessExecutor.check`), and reports each change
of verdict as a RUNNING task event carrying `health` and a growing `health_seq`.
`Verdicts` is the pure part: passes and failures in a row to verdicts.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

log = logging.getLogger("mesh.agent.health")

HEALTHY, UNHEALTHY = "healthy", "unhealthy"


@dataclass(slots=True)
class Verdicts:
    """Results in a row to a verdict: `healthy_after` passes make it healthy,
    `unhealthy_after` failures unhealthy; `observe` returns the verdict when it
    changes (the first one included), else None."""

    healthy_after: int
    unhealthy_after: int
    verdict: str = ""
    passes: int = 0
    failures: int = 0

    def observe(self, passed: bool) -> str | None:
        if passed:
            self.passes, self.failures = self.passes + 1, 0
            new = HEALTHY if self.passes >= self.healthy_after else self.verdict
        else:
            self.passes, self.failures = 0, self.failures + 1
            new = UNHEALTHY if self.failures >= self.unhealthy_after else self.verdict
        if new == self.verdict:
            return None
        self.verdict = new
        return new


async def check_loop(
    check: Callable[[], Awaitable[tuple[bool, str]]],
    report: Callable[[str, int, str], Awaitable[None]],
    interval_s: float,
    healthy_after: int,
    unhealthy_after: int,
) -> None:
    """Run `check` every `interval_s` until cancelled (the replica ended); `report`
    (verdict, its number, why) on every change. A check that raises counts as failed."""
    verdicts = Verdicts(healthy_after, unhealthy_after)
    seq = 0
    while True:
        try:
            passed, why = await check()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - a broken check is an unhealthy replica
            passed, why = False, f"health check could not run: {exc}"
        verdict = verdicts.observe(passed)
        if verdict is not None:
            seq += 1
            try:
                await report(verdict, seq, why)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - sent again at the next check
                log.info("health verdict %s not sent: %s", verdict, exc)
                verdicts.verdict = ""  # unknown to the coordinator: the next one is news
        await asyncio.sleep(interval_s)
