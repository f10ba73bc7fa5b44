"""Federation wire messages: what one region tells the others (docs/federation.md).

Kept apart from `mesh.schema` (the region's own messages) so the federation's
vocabulary grows in one place. Same conventions: frozen dataclasses with a `v`
version, msgpack via `mesh.codec`; `decode_summary` validates types, sizes and ranges
and raises `WireError` and nothing else, so a receiver counts and drops what fails.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from mesh import schema as _schema  # noqa: F401  (registers the Resources converter)
from mesh.codec import MAX_MESSAGE, WireError, decode, from_wire, unpack, wf
from mesh.subjects import is_token
from workloads.resources import Resources

__all__ = [
    "FED_KINDS",
    "HEALTH",
    "MAX_POOLS",
    "MAX_SHAPES",
    "FedMessage",
    "RegionSummary",
    "WireError",
    "decode_fed",
    "decode_summary",
]

MAX_SHAPES = 32  # largest free node shapes a summary carries: enough to judge a gang
MAX_POOLS = 256  # pools with a queue a summary names (the deepest); `queued` counts all
# "ok": a leader and ready nodes; "degraded": some nodes suspect or down, or the log's
# leader is not the one publishing; "no_nodes": nothing can be placed here now.
HEALTH = ("ok", "degraded", "no_nodes")


@dataclass(frozen=True, slots=True)
class RegionSummary:
    """One region's state as the others need it to decide where a job could go: what it
    has, what is free now (in total and as the largest free node shapes, largest
    first), how deep its queues are, and its health; `ts` (the publisher's wall clock)
    is what makes a summary fresh or stale. Built by
    `coordinator.federation.summary.summarize`."""

    region: str = wf(max_len=64)
    ts: float = wf(ge=0.0)
    leader: str = wf("", max_len=64)
    term: int = wf(0, ge=0)
    capacity: Resources = field(default_factory=Resources)  # ready nodes, allocatable
    free: Resources = field(default_factory=Resources)  # what they have not granted
    largest_free: tuple[Resources, ...] = wf((), max_len=MAX_SHAPES)
    nodes: dict[str, int] = wf(default_factory=dict, max_len=16)  # count per status
    queued: int = wf(0, ge=0)  # jobs waiting, all pools
    queue: dict[str, int] = wf(default_factory=dict, max_len=MAX_POOLS)  # pool -> waiting
    health: str = wf("ok", choices=HEALTH)
    v: int = 1


def decode_summary(data: bytes) -> RegionSummary:
    """A summary off the wire; `WireError` for anything malformed."""
    return decode(RegionSummary, data, max_size=MAX_MESSAGE)


# ---------------------------------------------------------------- forwarded jobs

# The federation core's messages (coordinator/federation/messages.py), by kind.
FED_KINDS = ("nominate", "confirm", "revoke", "admitted", "refused", "gave_up", "finished")
ID = 256  # longest job id (as mesh.schema)


@dataclass(frozen=True, slots=True)
class FedMessage:
    """One message of the forwarding protocol, home <-> holder, as it crosses between
    regions (published into the receiver's inbox stream). `kind` names the core's
    message; `running`, `reason`, `outcome` are its kind's own fields; `spec` (the job
    spec's `to_dict`) travels with a nomination and a confirm, so the holder can judge
    the job and then run it without ever reading the home's log."""

    kind: str = wf(choices=FED_KINDS)
    job: str = wf(max_len=ID)
    epoch: int = wf(ge=0)
    home: str = wf(max_len=64)
    holder: str = wf(max_len=64)
    running: bool = False
    reason: str = wf("", max_len=1024)
    outcome: str = wf("", max_len=64)
    spec: dict[str, Any] | None = None
    ts: float = 0.0
    v: int = 1


MAX_FED_BATCH = 256


@dataclass(frozen=True, slots=True)
class FedBatch:
    """The messages one pass has for one region, in one stream message. Every stream
    write is its own fsync and its own round trip: a burst of 200 forwards is 600 of
    them one by one, and a few batched."""

    items: tuple[FedMessage, ...] = wf((), max_len=MAX_FED_BATCH)
    v: int = 1


def _checked(msg: FedMessage) -> FedMessage:
    if not (is_token(msg.home) and is_token(msg.holder)) or msg.home == msg.holder:
        raise WireError("home", f"{msg.home!r} and holder {msg.holder!r}: two distinct regions")
    if msg.kind in ("nominate", "confirm") and not msg.spec:
        raise WireError("spec", f"a {msg.kind} carries the job's spec")
    return msg


def decode_fed(data: bytes) -> FedMessage:
    """A forwarding message off the wire; `WireError` for anything malformed (its regions
    must be subject tokens; a nomination or confirm must carry a spec)."""
    return _checked(decode(FedMessage, data, max_size=MAX_MESSAGE))


def decode_fed_batch(data: bytes) -> tuple[FedMessage, ...]:
    """What an inbox message carries: a batch of forwarding messages, or one; every one
    checked as `decode_fed` checks it (one bad item refuses the whole batch)."""
    obj = unpack(data, max_size=MAX_MESSAGE)
    if isinstance(obj, dict) and "items" in obj:
        items = from_wire(FedBatch, obj).items
    else:
        items = (from_wire(FedMessage, obj),)
    return tuple(_checked(m) for m in items)
