"""What each identity may publish and subscribe to: a pure function of the region and
the identity, built from `mesh.subjects` (never from a second copy of a subject).

The NATS server enforces these (`authorization.users[].permissions`); whatever is not
listed is denied. JetStream is reached through subjects too, so an agent's access to
the assignment stream is limited to the API calls of its own durable consumer:

- `CONSUMER.INFO` / `CONSUMER.MSG.NEXT` of `agent_<node>`, and `$JS.ACK` of its messages;
- `CONSUMER.CREATE.<stream>.agent_<node>.<its assign subject>`: the filter is part of
  the subject, and the server rejects a request whose body names another filter, so an
  agent cannot create a consumer over another node's assignments. The older create
  subjects that carry no filter (`CONSUMER.CREATE.<stream>.<name>`,
  `CONSUMER.DURABLE.CREATE...`) are not granted.

Replies come back on the identity's own inbox prefix (see `mesh.security.identity`).
A user may also send the NATS micro discovery requests (`$SRV.PING`, `$SRV.INFO`,
`$SRV.STATS`, with or without a service name and id), and nothing else under `$SRV`.

Federation (docs/federation.md): the coordinators, and only they, may publish and
subscribe to `mesh.fed.>`, which every region's coordinators share across the gateways,
and send `job.submit` to any region's API (`mesh.*.api.job.submit`: a submission whose
spec names other regions is made in the first); everyone else keeps their own region's
subjects only.

Edge sites (edge/README.md): a `site` identity is the leaf server's own, and its
permissions are what may cross the leaf link, in the site's direction: publish = what
the site may send into the region, subscribe = what the region delivers to the site
(nats-server swaps them internally on the hub's side of the link; the tests check the
direction). It speaks for the nodes it is configured with (`site_nodes`), as a fleet
does: their heartbeats, their forwarded events, their agents' assignment consumers and
stream checks through `$JS.hub.API`, their acks, their inboxes and log requests, and
the site's own beat, hub probe (`$JS.hub.API.INFO`) and inbox. Site users may only open
leaf connections and every other identity only client connections
(`allowed_connection_types`), so an agent's certificate cannot open a leaf link.

Inference (docs/inference_deploy.md): a `router` takes client requests and sends batches
to workers; a `worker` (the identity an agent hands to the inference tasks it runs)
announces itself and answers batches. Neither may touch JetStream, node state or
assignments; users may send inference requests besides calling the API.

Tasks: the worker identity is what an agent hands to any task that asks for it
(`MESH_TASK_IDENTITY=worker`), so it is also the identity of a task that calls the API.
It may call the endpoints of `TASK_API` and no other: `job.hosts`, which a
horovod-elastic job's discovery script runs from inside task 0 (docs/training.md). A
read, of any job's hosts in the region (NATS cannot tie a request to the job it asks
about); nothing that submits, kills, scales or changes anything.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from mesh import subjects
from mesh.security.identity import (
    AGENT,
    COORDINATOR,
    FLEET,
    ROUTER,
    SITE,
    USER,
    WORKER,
    Identity,
    IdentityError,
)
from mesh.server import UserPermission

JS_API = "$JS.API"
# How a site's leaf reaches the hub's JetStream: the hub (domain `hub`) maps
# `$JS.hub.API.>` to its own `$JS.API.>`, and a leaf's message crosses the link under
# the subject its client sent, so a site's rights name the domain's prefix.
HUB_JS_API = f"$JS.{subjects.HUB_DOMAIN}.API"
LEAFNODE, STANDARD = "LEAFNODE", "STANDARD"  # nats-server's allowed_connection_types
JS_ACK = "$JS.ACK"
JS_FLOW_CONTROL = "$JS.FC.>"
SERVICE_DISCOVERY = "$SRV.>"  # nats micro: PING/INFO/STATS
# What a discovery request is sent to: `$SRV.<verb>`, `$SRV.<verb>.<service>` and
# `$SRV.<verb>.<service>.<id>` (nats micro's control subjects), for the three verbs only.
DISCOVERY_VERBS = ("PING", "INFO", "STATS")
# Every region's `job.submit` (`mesh.<r>.api.job.submit`, any r): where a coordinator
# forwards a submission whose spec names other regions. Only that endpoint.
FORWARDED_SUBMIT = "mesh.*.api." + subjects.api("x", "job.submit").split(".api.", 1)[1]
# The request API endpoints a task may call with the identity its agent hands it (the
# worker identity): Horovod's host discovery (`mesh job hosts`), a read. Only these.
TASK_API = ("job.hosts",)
DISCOVERY_REQUESTS = tuple(
    s for verb in DISCOVERY_VERBS for s in (f"$SRV.{verb}", f"$SRV.{verb}.>")
)


@dataclass(frozen=True)
class Permissions:
    publish: tuple[str, ...]
    subscribe: tuple[str, ...]
    allow_responses: bool = False


def _all_under(subject: str) -> str:
    """`a.b.c` -> `a.b.>`: everything beside and below a subject's last token."""
    return subject.rsplit(".", 1)[0] + ".>"


def _any_last(subject: str) -> str:
    """`a.b.c` -> `a.b.*`."""
    return subject.rsplit(".", 1)[0] + ".*"


def fleet_consumer(prefix: str) -> str:
    """The durable consumer of a hollow fleet (agent.link.FleetFeed names it so)."""
    return f"fleet_{subjects.token(prefix, 'fleet prefix')}"


def infer_hello(region: str) -> str:
    """Where inference workers announce themselves. `mesh/` may not import `inference/`,
    so the router<->worker subjects are mirrored here from `inference.wire`, and a test
    pins the two together (they belong in `mesh.subjects`, beside `infer`)."""
    return f"mesh.{subjects.token(region, 'region')}.infer_hello"


def infer_worker_all(region: str) -> str:
    """Every worker's batch subject, `mesh.<r>.infer_worker.<worker id>`."""
    return f"mesh.{subjects.token(region, 'region')}.infer_worker.*"


def _streams(region: str) -> list[str]:
    return [
        subjects.log_stream(region),
        subjects.assign_stream(region),
        subjects.events_stream(region),
    ]


def _ensure_streams(region: str) -> list[str]:
    """What `mesh.streams.ensure_streams(agent=True)` sends: create (a no-op, or refused,
    once the coordinator made them) then info, for the assignment and event streams only.
    The job log is the coordinator's: an agent that could create it first could give it
    its own limits and retention."""
    out = []
    for s in _streams(region):
        if s != subjects.log_stream(region):
            out += [f"{JS_API}.STREAM.CREATE.{s}", f"{JS_API}.STREAM.INFO.{s}"]
    return out


def _consumer_calls(stream: str, consumer: str, filter_subject: str | None) -> list[str]:
    create = f"{JS_API}.CONSUMER.CREATE.{stream}.{consumer}"
    return [
        f"{JS_API}.CONSUMER.INFO.{stream}.{consumer}",
        f"{create}.{filter_subject}" if filter_subject else create,
        f"{JS_API}.CONSUMER.MSG.NEXT.{stream}.{consumer}",
        f"{JS_ACK}.{stream}.{consumer}.>",
    ]


def _site(r: str, site: str, nodes: Sequence[str], inbox: str) -> Permissions:
    """What crosses a site's leaf link (module docstring). Its agents' JetStream calls
    go to the hub's domain, so they are the agent's own consumer calls under
    `$JS.hub.API`; acks and the events the link forwards keep their plain subjects."""
    stream = subjects.assign_stream(r)
    hub = [
        c.replace(JS_API, HUB_JS_API, 1)
        for n in nodes
        for c in _consumer_calls(stream, subjects.agent_consumer(n), subjects.assign(r, n))
        if c.startswith(JS_API)
    ]
    acks = [f"{JS_ACK}.{stream}.{subjects.agent_consumer(n)}.>" for n in nodes]
    streams = [c.replace(JS_API, HUB_JS_API, 1) for c in _ensure_streams(r)] if nodes else []
    return Permissions(
        publish=(
            subjects.site_beat(r, site),
            f"{HUB_JS_API}.INFO",  # the link's probe of the region (account_info)
            *(subjects.state(r, n) for n in nodes),
            *(subjects.events(r, n) for n in nodes),  # the link forwards them
            *hub,
            *acks,
            *streams,
        ),
        subscribe=(
            inbox,
            *(f"{Identity.agent(n).inbox_prefix}.>" for n in nodes),
            *(subjects.task_logs(r, n) for n in nodes),
        ),
        allow_responses=bool(nodes),  # its agents answer log requests
    )


def permissions(
    region: str,
    identity: Identity,
    *,
    fleet_nodes: Sequence[str] = (),
    site_nodes: Sequence[str] = (),
) -> Permissions:
    """The permissions of `identity` in `region`. A fleet speaks for `fleet_nodes`,
    each of which must be named `<prefix>-...` (hollow nodes are); a site for
    `site_nodes` (any names: a site's machines are named by their operators)."""
    # Not `fed`: that region's subjects would be the federation's (a user could publish
    # summaries).
    r = subjects.region_token(region)
    inbox = identity.inbox_prefix + ".>"
    if identity.kind == AGENT:
        node = identity.name
        stream = subjects.assign_stream(r)
        return Permissions(
            publish=(
                subjects.state(r, node),
                subjects.events(r, node),
                subjects.site_beat_all(r),  # an edge site's link runs beside its agent
                *_consumer_calls(stream, subjects.agent_consumer(node), subjects.assign(r, node)),
                *_ensure_streams(r),
            ),
            subscribe=(subjects.assign(r, node), subjects.task_logs(r, node), inbox),
            allow_responses=True,  # it answers log requests
        )
    if identity.kind == FLEET:
        nodes = list(dict.fromkeys(fleet_nodes))
        for n in nodes:
            subjects.token(n, "node id")
            if not n.startswith(identity.name + "-"):
                raise IdentityError(f"fleet {identity.name!r} cannot speak for node {n!r}")
        stream = subjects.assign_stream(r)
        return Permissions(
            publish=(
                *(subjects.state(r, n) for n in nodes),
                *(subjects.events(r, n) for n in nodes),
                subjects.site_beat_all(r),  # a hollow site's link beats for it
                # Its consumer filters on many subjects, which no create subject can
                # carry: see docs/security.md ("hollow fleets").
                *_consumer_calls(stream, fleet_consumer(identity.name), None),
                *_ensure_streams(r),
            ),
            subscribe=(inbox,),
        )
    if identity.kind == SITE:
        nodes = [subjects.token(n, "node id") for n in dict.fromkeys(site_nodes)]
        return _site(r, identity.name, nodes, inbox)
    if identity.kind == USER:
        return Permissions(
            publish=(
                _all_under(subjects.api(r, "x")),
                _any_last(subjects.task_logs(r, "x")),  # `mesh job logs` asks the agent
                _any_last(subjects.infer(r, "x")),  # inference requests to the router
                # Service discovery (`nats micro ls`, `$SRV.PING/INFO/STATS`): the
                # answers come to the user's inbox like the API's.
                *DISCOVERY_REQUESTS,
            ),
            subscribe=(inbox,),
        )
    if identity.kind == WORKER:
        # The identity an agent hands to its tasks (inference workers, a horovod
        # launcher). One identity serves every worker an agent runs, so it may take any
        # worker's batches: worker ids are chosen by the tasks, and NATS cannot grant a
        # subject by prefix within a token. See docs/security.md ("inference").
        return Permissions(
            # The endpoints a task may call (TASK_API), each named: never `api.>`.
            publish=(infer_hello(r), *(subjects.api(r, e) for e in TASK_API)),
            subscribe=(infer_worker_all(r), inbox),
            allow_responses=True,  # batch results go to the router's reply inbox
        )
    if identity.kind == ROUTER:
        return Permissions(
            publish=(infer_worker_all(r),),  # batches; answers go out as responses
            subscribe=(_any_last(subjects.infer(r, "x")), infer_hello(r), inbox),
            allow_responses=True,  # one answer to each client request
        )
    if identity.kind == COORDINATOR:
        return Permissions(
            publish=(
                subjects.assign_all(r),
                subjects.job_log(r),
                _all_under(subjects.leader_api(r, "x")),  # followers forward writes
                f"{JS_API}.>",
                f"{JS_ACK}.>",
                JS_FLOW_CONTROL,
                f"$KV.{subjects.lease_bucket(r)}.>",
                subjects.fed_all(),  # region summaries, forwarded jobs
                # A submission naming other regions is made in its first one, sent on
                # by this region's coordinator (coordinator/federation/forward.py).
                FORWARDED_SUBMIT,
            ),
            subscribe=(
                subjects.state_all(r),
                subjects.site_beat_all(r),  # edge sites' beats (edge/sites.py)
                subjects.fed_all(),
                _all_under(subjects.api(r, "x")),
                _all_under(subjects.leader_api(r, "x")),
                SERVICE_DISCOVERY,
                inbox,
            ),
            allow_responses=True,  # API replies
        )
    raise IdentityError(f"unknown identity kind {identity.kind!r}")  # pragma: no cover


def server_users(
    region: str,
    identities: Iterable[Identity],
    *,
    fleets: Mapping[str, Sequence[str]] | None = None,
    sites: Mapping[str, Sequence[str]] | None = None,
) -> list[UserPermission]:
    """The `authorization.users` of a region's servers: one per identity, named as
    `verify_and_map` names a client presenting that identity's certificate. `fleets`
    maps a fleet prefix to the node ids it speaks for, `sites` a site to its nodes
    (none if absent). A site's user may only open a leaf connection, every other only
    a client connection."""
    fleets, sites = fleets or {}, sites or {}
    out = []
    for ident in dict.fromkeys(identities):
        p = permissions(
            region,
            ident,
            fleet_nodes=fleets.get(ident.name, ()) if ident.kind == FLEET else (),
            site_nodes=sites.get(ident.name, ()) if ident.kind == SITE else (),
        )
        out.append(
            UserPermission(
                ident.user_name,
                list(p.publish),
                list(p.subscribe),
                p.allow_responses,
                (LEAFNODE,) if ident.kind == SITE else (STANDARD,),
            )
        )
    return out
