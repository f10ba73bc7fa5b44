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

from nats.js import JetStreamContext
from nats.js.api import DiscardPolicy, RetentionPolicy, StorageType, StreamConfig
from nats.js.errors import BadRequestError

from mesh import subjects

DUPLICATE_WINDOW_S = 120.0


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
