"""Edge-site wire messages: what a site link tells its region, and its own agents.

Kept apart from `mesh.schema` (a region's own messages) and `mesh.fedschema` (between
regions), with the same conventions: frozen dataclasses with a `v` version, msgpack via
`mesh.codec`; the decoders validate types, sizes and ranges and raise `WireError` and
nothing else, so a receiver counts and drops what fails.
"""

from __future__ import annotations

from dataclasses import dataclass

from mesh.codec import WireError, decode, wf
from mesh.subjects import is_token

__all__ = ["MAX_SITE_NODES", "SiteBeat", "SiteUplink", "WireError", "decode_beat", "decode_uplink"]

MAX_SITE_NODES = 4096
MAX_MESSAGE = 256 * 1024
NEVER = -1.0  # autonomy_s meaning "never declare this site's tasks lost"


@dataclass(frozen=True, slots=True)
class SiteBeat:
    """A site link's beat to its region (`subjects.site_beat`), every 2 s while the
    link is up: the region knows the site is connected while beats come, and learns
    from them how long the site may be cut off before its tasks are run elsewhere.

    `autonomy_s`: how long after the region last heard the site it may declare the
    site's tasks lost; NEVER (the default) means never. `backlog`: events stored on the
    site and not yet forwarded; `forwarded`: events forwarded since the link started;
    `cut_since`: when the site last lost the region (0: never), for the region's log."""

    site: str = wf(max_len=64)
    region: str = wf(max_len=64)
    seq: int = wf(ge=0)
    ts: float = wf(ge=0.0)
    autonomy_s: float = wf(NEVER, ge=NEVER)
    nodes: tuple[str, ...] = wf((), max_len=MAX_SITE_NODES)
    backlog: int = wf(0, ge=0)
    forwarded: int = wf(0, ge=0)
    cut_since: float = wf(0.0, ge=0.0)
    v: int = 1


@dataclass(frozen=True, slots=True)
class SiteUplink:
    """A site link's word to its own agents (`subjects.site_uplink`, on the leaf only,
    every beat, and at once on a change): whether the region is reachable now, and
    since when it is not. An agent that hears `reachable=False` is cut off and acts
    alone (restarts in place)."""

    site: str = wf(max_len=64)
    ts: float = wf(ge=0.0)
    reachable: bool = True
    since: float = wf(0.0, ge=0.0)  # when it became unreachable (0 while reachable)
    v: int = 1


def _checked_site(site: str) -> None:
    if not is_token(site):
        raise WireError(f"site {site!r} is not a valid token")


def decode_beat(data: bytes) -> SiteBeat:
    beat = decode(SiteBeat, data, max_size=MAX_MESSAGE)
    _checked_site(beat.site)
    if not is_token(beat.region):
        raise WireError(f"region {beat.region!r} is not a valid token")
    for node in beat.nodes:
        if not is_token(node):
            raise WireError(f"node id {node!r} is not a valid token")
    return beat


def decode_uplink(data: bytes) -> SiteUplink:
    msg = decode(SiteUplink, data, max_size=MAX_MESSAGE)
    _checked_site(msg.site)
    return msg
