"""The region's JetStream streams, declared once and created idempotently by whoever
starts first (coordinator or agent).

- job log: the coordinator's durable history; one subject, so `expected-last-sequence`
  on appends fences the whole log against a deposed leader.
- assignments: work-queue retention with one durable consumer per node (filtered on
  its own subject), so an agent that was away gets everything it missed, and what
  it acknowledged is gone.
- events: work-queue retention with one durable consumer shared by successive
  leaders: a new leader resumes where the old one stopped acknowledging.
"""

from __future__ import annotations

import contextlib
import logging

from nats.js import JetStreamContext
from nats.js.api import DiscardPolicy, RetentionPolicy, StorageType, StreamConfig
from nats.js.errors import BadRequestError, NotFoundError, ServerError

from mesh import subjects

log = logging.getLogger("mesh.streams")

DUPLICATE_WINDOW_S = 120.0
INSUFFICIENT_STORAGE = 10047  # JetStream's err_code: the store cannot hold a stream's bound


def stream_configs(region: str, replicas: int = 1) -> list[StreamConfig]:
    common = dict(
        storage=StorageType.FILE, num_replicas=replicas, duplicate_window=DUPLICATE_WINDOW_S
    )
    return [
        StreamConfig(
            name=subjects.log_stream(region),
            subjects=[subjects.job_log(region)],
            retention=RetentionPolicy.LIMITS,
            max_msg_size=4 * 1024 * 1024,
            **common,
        ),
        StreamConfig(
            name=subjects.assign_stream(region),
            subjects=[subjects.assign_all(region)],
            retention=RetentionPolicy.WORK_QUEUE,
            discard=DiscardPolicy.OLD,
            max_age=7 * 24 * 3600.0,
            # One durable consumer per real agent: the server's default cap is 1,000.
            max_consumers=100_000,
            **common,
        ),
        StreamConfig(
            name=subjects.events_stream(region),
            subjects=[subjects.events_all(region)],
            retention=RetentionPolicy.WORK_QUEUE,
            discard=DiscardPolicy.OLD,
            max_age=7 * 24 * 3600.0,
            **common,
        ),
    ]


SITE_STREAM_BYTES = 256 * 1024 * 1024


def site_stream_config(region: str, site: str, max_bytes: int = SITE_STREAM_BYTES) -> StreamConfig:
    """An edge site's events stream, on its leaf (edge/README.md): limits retention (the
    site link purges what it forwarded), bounded, and discarding NEW when full, so a full
    site refuses an event (its agent keeps it and retries) rather than drop an old one
    not yet forwarded."""
    return StreamConfig(
        name=subjects.site_events_stream(site),
        subjects=[subjects.site_events_all(region, site)],
        retention=RetentionPolicy.LIMITS,
        discard=DiscardPolicy.NEW,
        max_bytes=max_bytes,
        storage=StorageType.FILE,
        num_replicas=1,
        duplicate_window=DUPLICATE_WINDOW_S,
    )


async def ensure_site_stream(
    js: JetStreamContext, region: str, site: str, *, max_bytes: int = SITE_STREAM_BYTES
) -> None:
    """Create the site's events stream on the leaf (`js`: the site's own domain), or keep
    the one there: idempotent, so every agent of the site and its link may call it.
    Whoever creates it first sets its bound (`mesh edge up`: from the leaf's store). An
    agent does not know the store's size, the server does: a bound it cannot hold is
    refused ("insufficient storage") and halved until one fits, and that one is halved
    once more, leaving room for the rest of the site's JetStream (the link's cursor)."""
    name = subjects.site_events_stream(site)
    with contextlib.suppress(NotFoundError):
        await js.stream_info(name)
        return
    refused = False
    while True:
        cfg = site_stream_config(region, site, max_bytes)
        try:
            await js.add_stream(cfg)
            break
        except BadRequestError:
            await js.stream_info(name)  # made meanwhile, with another config: kept
            return
        except ServerError as exc:
            if exc.err_code != INSUFFICIENT_STORAGE or max_bytes <= 1024 * 1024:
                raise
            refused = True
            max_bytes //= 2
    if refused:
        cfg.max_bytes = max_bytes // 2
        await js.update_stream(cfg)


async def raise_replicas(js: JetStreamContext, stream: str, replicas: int) -> None:
    """Scale an existing stream up to `replicas` in place; never down. A stream (or KV
    bucket) made first with fewer would live on one server of the cluster."""
    info = await js.stream_info(stream)
    if (info.config.num_replicas or 1) < replicas:
        info.config.num_replicas = replicas
        await js.update_stream(info.config)


async def ensure_streams(
    js: JetStreamContext, region: str, replicas: int = 1, *, agent: bool = False
) -> None:
    """Create the streams, or keep them as they are; only ever raise their replicas.

    Whoever starts first creates them: an agent (which asks for 1 replica) may come up
    before a coordinator configured for 3, so a stream found with fewer replicas than
    asked for is scaled up in place. Fewer are never asked of an existing stream."""
    for cfg in stream_configs(region, replicas):
        if agent and cfg.name == subjects.log_stream(region):
            continue  # the job log is the coordinator's: an agent may not create it
        try:
            await js.add_stream(cfg)
        except BadRequestError:
            # Already there with a different config (e.g. created by an older version):
            # keep it rather than fail start-up; the subjects are what matter.
            await raise_replicas(js, cfg.name, replicas)


async def node_streams(
    nc, region: str, site: str = "", timeout: float = 5.0
) -> tuple[JetStreamContext, JetStreamContext]:
    """A node's two JetStream contexts, its streams made: (where its events go, where the
    region's streams are). The same context unless the node is an edge site's: then
    its events go to the site's stream on the leaf and the region is reached through
    the hub's domain. A site's node starts while the site is cut off (or its leaf is not
    linked yet): it runs what it has, stores its events at the site, and its
    assignment feed binds once the hub is there, so the region's streams it cannot
    reach are a warning, not a failure."""
    events_js = nc.jetstream(timeout=timeout)
    if not site:
        await ensure_streams(events_js, region, agent=True)
        return events_js, events_js
    hub_js = nc.jetstream(domain=subjects.HUB_DOMAIN, timeout=timeout)
    await ensure_site_stream(events_js, region, site)
    try:
        await ensure_streams(hub_js, region, agent=True)
    except Exception as exc:
        log.warning("region %s not reachable from site %s: %s", region, site, exc)
    return events_js, hub_js
