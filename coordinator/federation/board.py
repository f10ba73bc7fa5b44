"""The summary board, a coordinator candidate's thin shell around `summary.py`: while it
leads, it publishes its region's summary on `mesh.fed.summary.<region>` every
`interval_s` and as soon as it changes (checked every `check_s`); whether it leads
or not, it keeps the latest summary heard from each region, its own included, for
`region.list` and for the federation's decisions. Bounded (`MAX_REGIONS`); a bad
message, or one on another region's subject, is counted and dropped."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from coordinator.federation.summary import RegionSummary, changed, region_rows
from mesh import subjects
from mesh.codec import WireError, encode
from mesh.fedschema import decode_summary

log = logging.getLogger("mesh.coordinator.federation")

MAX_REGIONS = 1024


@dataclass(frozen=True, slots=True)
class BoardConfig:
    interval_s: float = 2.0  # publish at least this often while leading
    check_s: float = 0.25  # look for a change this often (bounds the rate on change)
    max_age_s: float = 6.0  # an older summary is stale: ignored
    unreachable_s: float = 30.0  # a region silent this long is unreachable

    def __post_init__(self) -> None:
        if not 0 < self.check_s <= self.interval_s:
            raise ValueError("summaries: need 0 < check_s <= interval_s")
        if not self.interval_s < self.max_age_s <= self.unreachable_s:
            raise ValueError("summaries: need interval_s < max_age_s <= unreachable_s")


class Board:
    def __init__(
        self, region: str, config: BoardConfig, build: Callable[[float], RegionSummary | None]
    ) -> None:
        """`build(now)`: this region's summary now, or None while this candidate does not
        lead (then nothing is published)."""
        self.region = region
        self.config = config
        self.build = build
        self.latest: dict[str, RegionSummary] = {}
        self.bad = 0  # messages dropped: undecodable, or speaking for another region
        self.published = 0
        self._nc = None
        self._sub = None
        self._task: asyncio.Task | None = None
        self._last: RegionSummary | None = None

    async def start(self, nc) -> None:
        self._nc = nc
        self._sub = await nc.subscribe(subjects.fed_summary_all(), cb=self._on_summary)
        self._task = asyncio.ensure_future(self._publish_loop())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
            self._task = None
        if self._sub is not None:
            with contextlib.suppress(Exception):
                await self._sub.unsubscribe()
            self._sub = None

    def rows(self, now: float) -> list[dict]:
        return region_rows(self.latest, now, self.config.max_age_s, self.config.unreachable_s)

    async def _on_summary(self, msg) -> None:
        try:
            s = decode_summary(msg.data)
        except WireError as exc:
            self.bad += 1
            log.debug("bad region summary dropped: %s", exc)
            return
        if subjects.fed_summary_region(msg.subject) != s.region:
            self.bad += 1  # a region may only speak for itself
            return
        old = self.latest.get(s.region)
        if old is None and len(self.latest) >= MAX_REGIONS:
            self.bad += 1
            return
        if old is None or s.ts >= old.ts:  # a late, older one does not replace a newer
            self.latest[s.region] = s

    async def _publish_loop(self) -> None:
        last_sent = 0.0
        while True:
            try:
                now = time.time()
                summary = self.build(now)
                if summary is None:
                    self._last = None  # a new term publishes at once
                elif changed(self._last, summary) or now - last_sent >= self.config.interval_s:
                    await self._nc.publish(subjects.fed_summary(self.region), encode(summary))
                    self._last, last_sent = summary, now
                    self.published += 1
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a closed or reconnecting connection: next tick
                log.debug("region summary not published: %s", exc)
            await asyncio.sleep(self.config.check_s)
