"""Health checks on a real agent: verdicts from results in a row, and a check run as a
real process with the task's env, killed at its timeout."""

from __future__ import annotations

import asyncio
import time

from agent.executor import ExecSpec, ProcessExecutor
from agent.health import HEALTHY, UNHEALTHY, Verdicts, check_loop


def test_verdicts_need_their_runs_in_a_row():
    v = Verdicts(healthy_after=2, unhealthy_after=3)
    assert v.observe(True) is None  # one pass of two
    assert v.observe(True) == HEALTHY
    assert v.observe(True) is None  # no change, no report
    assert [v.observe(False) for _ in range(2)] == [None, None]
    assert v.observe(True) is None  # a pass breaks the run of failures
    assert [v.observe(False) for _ in range(3)] == [None, None, UNHEALTHY]
    assert v.observe(True) is None and v.observe(True) == HEALTHY


def test_a_check_runs_with_the_task_env_and_is_killed_at_its_timeout(tmp_path):
    async def main():
        ex = ProcessExecutor(tmp_path / "work")
        spec = ExecSpec("t#1", ("/bin/sleep", "30"), env=(("WANT", "yes"),))
        handle = await ex.start(spec)
        try:
            ok = ExecSpec("t#1", ("/bin/sh", "-c", 'test "$WANT" = yes'), env=spec.env)
            assert await ex.check(ok, 5.0) == (True, "")
            bad = ExecSpec("t#1", ("/bin/sh", "-c", "exit 3"), env=spec.env)
            assert await ex.check(bad, 5.0) == (False, "health check exited with 3")
            marker = tmp_path / "started"
            slow = ExecSpec("t#1", ("/bin/sh", "-c", f"touch {marker}; sleep 30"))
            t0 = time.monotonic()
            passed, why = await ex.check(slow, 0.5)
            assert not passed and "timed out after 0.5s" in why
            assert time.monotonic() - t0 < 10 and marker.exists()
        finally:
            await ex.kill(handle, 1.0)

    asyncio.run(main())


def test_the_loop_reports_each_change_once():
    results = iter([True, True, False, False, False, True])
    sent: list[tuple[str, int]] = []

    async def check():
        try:
            return next(results), ""
        except StopIteration:
            await asyncio.sleep(3600)
            raise

    async def report(verdict, seq, why):
        sent.append((verdict, seq))

    async def main():
        task = asyncio.create_task(check_loop(check, report, 0.01, 1, 3))
        for _ in range(200):
            if len(sent) == 3:
                break
            await asyncio.sleep(0.01)
        task.cancel()

    asyncio.run(main())
    assert sent == [(HEALTHY, 1), (UNHEALTHY, 2), (HEALTHY, 3)]
