"""Every NATS subject, stream, consumer and bucket name Mesh uses, built in one place.

Tokens are validated here so a hostile node id or region can never widen a
subject (a `*`, `>` or `.` in a token would change what a subscription matches).
"""

from __future__ import annotations

import re

_TOKEN = re.compile(r"[A-Za-z0-9_-]{1,64}")
_ENDPOINT = re.compile(r"[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*){0,3}")


class SubjectError(ValueError):
    """A token that would not make a safe, single subject token."""


def token(value: str, what: str = "token") -> str:
    if not isinstance(value, str) or not _TOKEN.fullmatch(value):
        raise SubjectError(
            f"{what} {value!r} must be 1-64 characters of letters, digits, '_' or '-'"
        )
    return value


def is_token(value: object) -> bool:
    """Whether `value` is a valid token: for checking what a peer sent before building a
    subject from it (which would raise)."""
    return isinstance(value, str) and _TOKEN.fullmatch(value) is not None


def _last_token(prefix: str, subject: str) -> str | None:
    """The one token `subject` has after `prefix`, or None when it is not that."""
    rest = subject[len(prefix) :] if subject.startswith(prefix) else ""
    return rest if is_token(rest) else None


def _r(region: str) -> str:
    return f"mesh.{token(region, 'region')}"


# Agent <-> coordinator
def state(region: str, node: str) -> str:
    return f"{_r(region)}.state.{token(node, 'node id')}"


def state_all(region: str) -> str:
    return f"{_r(region)}.state.*"


def assign(region: str, node: str) -> str:
    return f"{_r(region)}.assign.{token(node, 'node id')}"


def assign_all(region: str) -> str:
    return f"{_r(region)}.assign.>"


def events(region: str, node: str) -> str:
    return f"{_r(region)}.events.{token(node, 'node id')}"


def events_all(region: str) -> str:
    return f"{_r(region)}.events.>"


def task_logs(region: str, node: str) -> str:
    """Request subject on which an agent serves its tasks' log files."""
    return f"{_r(region)}.logs.{token(node, 'node id')}"


# The coordinator's job log (one subject: expected-last-sequence fences the whole stream)
def job_log(region: str) -> str:
    return f"{_r(region)}.log"


# Request API
def api(region: str, endpoint: str) -> str:
    return f"{_r(region)}.api.{_endpoint(endpoint)}"


def api_prefix(region: str) -> str:
    return f"{_r(region)}.api"


def leader_api(region: str, endpoint: str) -> str:
    """Served by the leader alone; followers forward writes here."""
    return f"{_r(region)}.leader.{_endpoint(endpoint)}"


def _endpoint(endpoint: str) -> str:
    if not isinstance(endpoint, str) or not _ENDPOINT.fullmatch(endpoint):
        raise SubjectError(f"endpoint {endpoint!r} is not a valid dotted name")
    return endpoint


def infer(region: str, model: str) -> str:
    return f"{_r(region)}.infer.{token(model, 'model')}"


# JetStream names (no dots allowed in these)
def log_stream(region: str) -> str:
    return f"MESH_LOG_{token(region, 'region')}"


def assign_stream(region: str) -> str:
    return f"MESH_ASSIGN_{token(region, 'region')}"


def events_stream(region: str) -> str:
    return f"MESH_EVENTS_{token(region, 'region')}"


def agent_consumer(node: str) -> str:
    return f"agent_{token(node, 'node id')}"


def events_consumer() -> str:
    """One durable consumer shared by successive leaders: a new leader resumes where
    the old one stopped acknowledging."""
    return "coordinator"


def lease_bucket(region: str) -> str:
    return f"mesh_lease_{token(region, 'region')}"


LEADER_KEY = "leader"
SERVICE_NAME = "mesh"

# Federation (docs/federation.md): `mesh.fed.*` is shared by every region's coordinators
# (summaries, forwarded jobs), so no region may be named `fed` (its subjects would be
# these).
FED = "fed"


def fed_all() -> str:
    """Every federation subject: what a coordinator may publish and subscribe to."""
    return f"mesh.{FED}.>"


def region_token(region: str) -> str:
    """`token`, and not `fed` (see FED)."""
    if token(region, "region") == FED:
        raise SubjectError(f"region {region!r} is reserved: mesh.{FED}.* is the federation's")
    return region


def fed_summary(region: str) -> str:
    """Where a region's leader publishes its summary (coordinator/federation/summary.py)."""
    return f"mesh.fed.summary.{token(region, 'region')}"


def fed_summary_all() -> str:
    """Every region's summary: each coordinator candidate keeps the latest of each."""
    return "mesh.fed.summary.*"


def fed_summary_region(subject: str) -> str | None:
    """The region a summary subject names, or None when it is not one."""
    prefix = "mesh.fed.summary."
    return _last_token(prefix, subject)


# Forwarded jobs (coordinator/federation/link.py): each region's leader reads one inbox
# stream in its own cluster; a message to region R from region S is published on
# `mesh.fed.in.R.S`. (`in` comes before the region so that no region name, `summary`
# included, can make an inbox subject overlap the summaries'.)
def fed_inbox(region: str, sender: str) -> str:
    return f"mesh.fed.in.{region_token(region)}.{region_token(sender)}"


def fed_inbox_all(region: str) -> str:
    """Everything sent to `region`: its inbox stream's subjects."""
    return f"mesh.fed.in.{region_token(region)}.*"


def fed_inbox_sender(region: str, subject: str) -> str | None:
    """The sending region an inbox subject of `region` names, or None."""
    prefix = f"mesh.fed.in.{region}."
    return _last_token(prefix, subject)


def fed_stream(region: str) -> str:
    return f"FED_{region_token(region)}"


def fed_consumer() -> str:
    """The durable consumer of a region's inbox, shared by successive leaders."""
    return "leader"


# Edge sites (docs/edge.md, edge/README.md): a site is a NATS leafnode with its own
# JetStream domain. Its agents publish task events into the site's own stream (on the
# leaf, so a cut link never refuses them); the site link forwards them, in order, to
# the region's events stream, and beats so the region can tell a cut-off site from a
# dead node. Assignments stay in the region's stream; site agents read them through
# the hub's JetStream domain.
HUB_DOMAIN = "hub"  # the JetStream domain of every server a site's leaf connects to


def site_domain(site: str) -> str:
    """A site's JetStream domain on its leaf server (distinct per site, never the hub's)."""
    return f"site-{token(site, 'site')}"


def site_events(region: str, site: str, node: str) -> str:
    """Where an agent of `site` publishes its task events (stored on the leaf)."""
    return f"{_r(region)}.site.{token(site, 'site')}.events.{token(node, 'node id')}"


def site_events_all(region: str, site: str) -> str:
    return f"{_r(region)}.site.{token(site, 'site')}.events.*"


def site_events_node(region: str, site: str, subject: str) -> str | None:
    """The node a site events subject names, or None when it is not one."""
    prefix = f"{_r(region)}.site.{token(site, 'site')}.events."
    return _last_token(prefix, subject)


def site_events_stream(site: str) -> str:
    """The leaf-local stream of a site's task events (in the site's domain)."""
    return f"SITE_{token(site, 'site')}_EVENTS"


def site_state(region: str, site: str, node: str) -> str:
    """Where a site's node publishes its heartbeat (site-local: the site link relays it
    to `state(region, node)` when it changed in what the region acts on)."""
    return f"{_r(region)}.site.{token(site, 'site')}.state.{token(node, 'node id')}"


def site_state_all(region: str, site: str) -> str:
    return f"{_r(region)}.site.{token(site, 'site')}.state.*"


def site_beat(region: str, site: str) -> str:
    """A site link's beat to its region (core NATS, every second: `SiteBeat`)."""
    return f"{_r(region)}.sitebeat.{token(site, 'site')}"


def site_beat_all(region: str) -> str:
    return f"{_r(region)}.sitebeat.*"


def site_beat_site(region: str, subject: str) -> str | None:
    """The site a beat subject names, or None when it is not one."""
    prefix = f"{_r(region)}.sitebeat."
    return _last_token(prefix, subject)


def site_uplink(region: str, site: str) -> str:
    """Where a site link tells the site's own agents whether the region is reachable
    (core NATS, on the leaf only: `SiteUplink`)."""
    return f"{_r(region)}.site.{token(site, 'site')}.uplink"


def site_link_bucket(site: str) -> str:
    """The site link's KV bucket on the leaf (its forwarding cursor), in the site's domain."""
    return f"SITE_{token(site, 'site')}_LINK"
