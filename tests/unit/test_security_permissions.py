"""The permission matrix: a pure function of region and identity."""

from __future__ import annotations

import pytest

from agent.hollow import HollowFleet
from agent.link import FleetFeed
from mesh import subjects
from mesh.cli.certs import fleet_node_ids
from mesh.security.identity import Identity, IdentityError
from mesh.security.permissions import TASK_API, fleet_consumer, permissions, server_users
from mesh.server import ServerConfig, ServerError, TlsFiles


def matches(pattern: str, subject: str) -> bool:
    """NATS subject matching (`*` one token, `>` the rest)."""
    p, s = pattern.split("."), subject.split(".")
    for i, tok in enumerate(p):
        if tok == ">":
            return len(s) > i
        if i >= len(s) or (tok != "*" and tok != s[i]):
            return False
    return len(p) == len(s)


def allowed(patterns, subject: str) -> bool:
    return any(matches(p, subject) for p in patterns)


R = "eu"
A, B = Identity.agent("node-a"), Identity.agent("node-b")
S = subjects.assign_stream(R)


def test_agent_speaks_only_for_itself():
    p = permissions(R, A)
    assert allowed(p.publish, subjects.state(R, "node-a"))
    assert allowed(p.publish, subjects.events(R, "node-a"))
    assert not allowed(p.publish, subjects.state(R, "node-b"))
    assert not allowed(p.publish, subjects.events(R, "node-b"))
    assert allowed(p.subscribe, subjects.assign(R, "node-a"))
    assert allowed(p.subscribe, subjects.task_logs(R, "node-a"))
    assert not allowed(p.subscribe, subjects.assign(R, "node-b"))
    assert not allowed(p.subscribe, "_INBOX.abc")  # nor everyone's replies
    assert not allowed(p.subscribe, "_INBOX.agent.node-b.x")
    assert allowed(p.subscribe, "_INBOX.agent.node-a.x")
    assert p.allow_responses


def test_agent_jetstream_is_its_own_consumer_only():
    p = permissions(R, A)
    own = subjects.agent_consumer("node-a")
    assert allowed(p.publish, f"$JS.API.CONSUMER.INFO.{S}.{own}")
    assert allowed(p.publish, f"$JS.API.CONSUMER.MSG.NEXT.{S}.{own}")
    assert allowed(p.publish, f"$JS.ACK.{S}.{own}.1.2.3.4.5")
    assert allowed(p.publish, f"$JS.API.CONSUMER.CREATE.{S}.{own}.{subjects.assign(R, 'node-a')}")
    other = subjects.agent_consumer("node-b")
    for subject in (
        f"$JS.API.CONSUMER.CREATE.{S}.{own}",  # no filter in the subject: any filter
        f"$JS.API.CONSUMER.CREATE.{S}.{own}.{subjects.assign(R, 'node-b')}",
        f"$JS.API.CONSUMER.CREATE.{S}.{other}.{subjects.assign(R, 'node-b')}",
        f"$JS.API.CONSUMER.DURABLE.CREATE.{S}.{own}",
        f"$JS.API.CONSUMER.CREATE.{S}",
        f"$JS.API.CONSUMER.MSG.NEXT.{S}.{other}",
        f"$JS.API.CONSUMER.DELETE.{S}.{other}",
        f"$JS.ACK.{S}.{other}.1.2.3.4.5",
        f"$JS.API.STREAM.UPDATE.{S}",
        f"$JS.API.STREAM.DELETE.{S}",
        f"$JS.API.STREAM.PURGE.{S}",
        "$JS.API.STREAM.CREATE.OTHER",
        "$JS.API.STREAM.CREATE." + subjects.log_stream(R),  # the job log is the coordinator's
        f"$KV.{subjects.lease_bucket(R)}.{subjects.LEADER_KEY}",
        subjects.api(R, "job.submit"),
        subjects.api(R, "pool.apply"),
        subjects.leader_api(R, "job.submit"),
        subjects.assign(R, "node-a"),
        subjects.job_log(R),
    ):
        assert not allowed(p.publish, subject), subject


def test_user_calls_the_api_only():
    p = permissions(R, Identity.user("alice"))
    assert allowed(p.publish, subjects.api(R, "job.submit"))
    assert allowed(p.publish, subjects.api(R, "pool.apply"))
    assert allowed(p.publish, subjects.task_logs(R, "node-a"))
    assert not allowed(p.publish, subjects.api("other", "job.submit"))
    assert not allowed(p.publish, subjects.state(R, "node-a"))
    assert not allowed(p.publish, subjects.leader_api(R, "job.submit"))
    assert not allowed(p.publish, subjects.assign(R, "node-a"))
    assert not allowed(p.publish, "$JS.API.STREAM.INFO." + S)
    assert p.subscribe == ("_INBOX.user.alice.>",)
    assert not p.allow_responses


def test_user_may_discover_services_and_nothing_else_under_srv():
    p = permissions(R, Identity.user("alice"))
    for verb in ("PING", "INFO", "STATS"):
        for subject in (f"$SRV.{verb}", f"$SRV.{verb}.mesh", f"$SRV.{verb}.mesh.abc123"):
            assert allowed(p.publish, subject), subject
    for subject in ("$SRV.SCHEDULE", "$SRV.PINGX", "$SRV", "$SRVX.PING"):
        assert not allowed(p.publish, subject), subject
    # the answers come to its own inbox, as the API's do; it answers nothing itself
    assert p.subscribe == ("_INBOX.user.alice.>",) and not p.allow_responses


def test_coordinator():
    p = permissions(R, Identity.coordinator())
    for subject in (
        subjects.assign(R, "node-a"),
        subjects.job_log(R),
        subjects.leader_api(R, "job.submit"),
        "$JS.API.STREAM.CREATE." + S,
        f"$KV.{subjects.lease_bucket(R)}.{subjects.LEADER_KEY}",
    ):
        assert allowed(p.publish, subject), subject
    assert not allowed(p.publish, subjects.state(R, "node-a"))
    assert not allowed(p.publish, subjects.events(R, "node-a"))
    for subject in (subjects.state(R, "n"), subjects.api(R, "job.get"), "$SRV.PING"):
        assert allowed(p.subscribe, subject)
    assert not allowed(p.subscribe, subjects.state("other", "n"))


def test_a_coordinator_may_forward_a_submission_to_any_region_but_nothing_else_there():
    p = permissions(R, Identity.coordinator())
    for region in ("us", "ap-1", R):
        assert allowed(p.publish, subjects.api(region, "job.submit")), region
    for endpoint in ("job.kill", "job.submit_many", "pool.apply", "job.get"):
        assert not allowed(p.publish, subjects.api("us", endpoint)), endpoint
    assert not allowed(p.subscribe, subjects.api("us", "job.submit"))
    # a user keeps its own region's API only
    user = permissions(R, Identity.user("alice"))
    assert not allowed(user.publish, subjects.api("us", "job.submit"))


def test_fleet_speaks_for_its_nodes_only():
    nodes = fleet_node_ids("sim", 3)
    p = permissions(R, Identity.fleet("sim"), fleet_nodes=nodes)
    for n in nodes:
        assert allowed(p.publish, subjects.state(R, n))
        assert allowed(p.publish, subjects.events(R, n))
    assert not allowed(p.publish, subjects.state(R, "sim-0003"))
    assert not allowed(p.publish, subjects.state(R, "node-a"))
    assert allowed(p.publish, f"$JS.API.CONSUMER.MSG.NEXT.{S}.{fleet_consumer('sim')}")
    assert not allowed(p.publish, f"$JS.API.CONSUMER.MSG.NEXT.{S}.{subjects.agent_consumer(n)}")
    with pytest.raises(IdentityError):
        permissions(R, Identity.fleet("sim"), fleet_nodes=["other-0000"])


def test_names_agree_with_the_agent_code():
    fleet = HollowFleet("nats://unused", R, 5, prefix="sim")
    assert list(fleet.nodes) == fleet_node_ids("sim", 5)
    feed = FleetFeed(None, R, "sim", list(fleet.nodes), lambda n, a: None)  # type: ignore[arg-type]
    assert feed.durable == fleet_consumer("sim")


@pytest.mark.parametrize("bad", ["a.b", "*", ">", "", "x y", "a" * 65])
def test_hostile_names_are_refused(bad):
    with pytest.raises(IdentityError):
        Identity.agent(bad)
    with pytest.raises(IdentityError):
        Identity.user(bad)


def test_identity_round_trip():
    for ident in (A, Identity.user("u"), Identity.fleet("f"), Identity.coordinator()):
        assert Identity.parse(ident.common_name) == ident
        assert ident.user_name == f"CN={ident.common_name}"
    for bad in ("root", "coordinator:x", "agent:", "admin:x"):
        with pytest.raises(IdentityError):
            Identity.parse(bad)


def test_server_config_renders_tls_and_users():
    users = server_users(R, [A, Identity.user("u")])
    cfg = ServerConfig(port=4222, store_dir="/s", tls=TlsFiles("/c/ca", "/c/s.crt", "/c/s.key"))
    with pytest.raises(ServerError):  # verify_and_map with no user would admit anyone
        cfg.render()
    cfg.users = users
    text = cfg.render()
    assert "verify_and_map: true" in text
    assert '"CN=agent:node-a"' in text and '"CN=user:u"' in text
    assert "allow_responses: true" in text
    with pytest.raises(ServerError):
        ServerConfig(users=users).render()  # users without TLS


# ---------------------------------------------------------------- inference identities

W, RT = Identity.worker("node-a"), Identity.router("main")


def _nothing_of_the_control_plane(p) -> None:
    for subject in (
        subjects.api(R, "job.submit"),
        subjects.api(R, "pool.apply"),
        subjects.leader_api(R, "job.submit"),
        subjects.state(R, "node-a"),
        subjects.events(R, "node-a"),
        subjects.assign(R, "node-a"),
        subjects.job_log(R),
        subjects.task_logs(R, "node-a"),
        f"$JS.API.STREAM.INFO.{S}",
        f"$JS.API.CONSUMER.MSG.NEXT.{S}.{subjects.agent_consumer('node-a')}",
        f"$KV.{subjects.lease_bucket(R)}.{subjects.LEADER_KEY}",
    ):
        assert not allowed(p.publish, subject), subject
    for subject in (
        subjects.assign(R, "node-a"),
        subjects.state(R, "node-a"),
        subjects.api(R, "job.submit"),
        subjects.task_logs(R, "node-a"),
        "_INBOX.abc",
        "_INBOX.user.admin.x",
        "_INBOX.agent.node-a.x",
        "_INBOX.coordinator.x",
    ):
        assert not allowed(p.subscribe, subject), subject


def test_worker_announces_and_answers_batches_only():
    from inference.wire import hello_subject, infer_subject, worker_subject

    p = permissions(R, W)
    assert allowed(p.publish, hello_subject(R))
    assert allowed(p.subscribe, worker_subject(R, "mlp-1234-worker-0"))
    assert p.allow_responses  # its batch results go to the router's inbox as replies
    assert allowed(p.subscribe, "_INBOX.worker.node-a.x")
    assert not allowed(p.subscribe, "_INBOX.router.main.x")  # nor the router's replies
    _nothing_of_the_control_plane(p)
    # It neither takes client requests (posing as a router) nor sends them or batches.
    assert not allowed(p.subscribe, infer_subject(R, "mlp"))
    assert not allowed(p.publish, infer_subject(R, "mlp"))
    assert not allowed(p.publish, worker_subject(R, "w2"))
    assert not allowed(p.publish, hello_subject("other"))
    assert not allowed(p.subscribe, worker_subject("other", "w2"))


def test_worker_may_call_job_hosts_and_no_other_endpoint():
    """A task holding the worker identity (horovod's discovery script runs `mesh job
    hosts` from task 0) may ask job.hosts of its own region, and nothing else of the
    API: each endpoint is named, never a wildcard under `api`."""
    from coordinator.api import ENDPOINTS

    p = permissions(R, W)
    assert TASK_API == ("job.hosts",)
    assert allowed(p.publish, subjects.api(R, "job.hosts"))
    assert subjects.api(R, "job.hosts") in p.publish  # literally, no wildcard
    assert not allowed(p.publish, subjects.api("other", "job.hosts"))
    assert not allowed(p.publish, subjects.leader_api(R, "job.hosts"))
    others = [e for e in ENDPOINTS if e != "job.hosts"]
    assert {"job.submit", "job.kill", "job.scale", "pool.apply"} <= set(others)
    for endpoint in others:
        assert not allowed(p.publish, subjects.api(R, endpoint)), endpoint
    assert not any(".api." in s and ("*" in s or ">" in s) for s in p.publish), p.publish
    # The reply comes to its own inbox, as every API reply does; the API's requests
    # themselves are the coordinator's to receive.
    assert allowed(p.subscribe, "_INBOX.worker.node-a.abc.1")
    assert not allowed(p.subscribe, subjects.api(R, "job.hosts"))
    # The router, which holds no task identity, gets no API at all.
    assert not allowed(permissions(R, RT).publish, subjects.api(R, "job.hosts"))
    users = {u.user: u for u in server_users(R, [W])}
    assert subjects.api(R, "job.hosts") in users["CN=worker:node-a"].publish


def test_router_takes_requests_and_sends_batches_only():
    from inference.wire import hello_subject, infer_all, infer_subject, worker_subject

    p = permissions(R, RT)
    assert allowed(p.subscribe, infer_subject(R, "mlp")) and infer_all(R) in p.subscribe
    assert allowed(p.subscribe, hello_subject(R))
    assert allowed(p.publish, worker_subject(R, "w1"))
    assert allowed(p.subscribe, "_INBOX.router.main.7")  # batch results
    assert p.allow_responses  # one answer per client request
    _nothing_of_the_control_plane(p)
    assert not allowed(p.publish, hello_subject(R))  # it cannot invent workers
    assert not allowed(p.publish, infer_subject(R, "mlp"))
    assert not allowed(p.subscribe, worker_subject(R, "w1"))  # nor take batches
    assert not allowed(p.subscribe, infer_subject("other", "mlp"))


def test_user_may_ask_for_inference_but_not_serve_it():
    from inference.wire import hello_subject, infer_subject, worker_subject

    p = permissions(R, Identity.user("alice"))
    assert allowed(p.publish, infer_subject(R, "mlp"))
    assert not allowed(p.publish, infer_subject("other", "mlp"))
    assert not allowed(p.publish, hello_subject(R))
    assert not allowed(p.publish, worker_subject(R, "w1"))
    assert not allowed(p.subscribe, infer_subject(R, "mlp"))


def test_control_plane_identities_have_nothing_of_inference():
    from inference.wire import hello_subject, infer_subject, worker_subject

    for ident in (A, Identity.fleet("sim"), Identity.coordinator()):
        p = permissions(R, ident, fleet_nodes=fleet_node_ids("sim", 1))
        for subject in (hello_subject(R), worker_subject(R, "w1"), infer_subject(R, "m")):
            assert not allowed(p.publish, subject), (ident, subject)
            assert not allowed(p.subscribe, subject), (ident, subject)


def test_inference_identities_round_trip():
    for ident in (W, RT):
        assert Identity.parse(ident.common_name) == ident
        assert ident.inbox_prefix == f"_INBOX.{ident.kind}.{ident.name}"
    for bad in ("worker:", "router:a.b", "worker:*"):
        with pytest.raises(IdentityError):
            Identity.parse(bad)
    users = {u.user: u for u in server_users(R, [W, RT])}
    assert set(users) == {"CN=worker:node-a", "CN=router:main"}


# ---------------------------------------------------------------- edge sites

SITE = Identity.site("s1")


def test_a_site_speaks_only_for_its_nodes_across_its_link():
    """Publish: what the site sends into the region; subscribe: what comes down."""
    p = permissions(R, SITE, site_nodes=["e1", "e2"])
    stream = subjects.assign_stream(R)
    for ok in (
        subjects.site_beat(R, "s1"),
        subjects.state(R, "e1"),
        subjects.events(R, "e2"),
        "$JS.hub.API.INFO",
        f"$JS.hub.API.CONSUMER.MSG.NEXT.{stream}.agent_e1",
        f"$JS.hub.API.CONSUMER.CREATE.{stream}.agent_e1.{subjects.assign(R, 'e1')}",
        f"$JS.ACK.{stream}.agent_e2.1.2.3.4.5",
        f"$JS.hub.API.STREAM.INFO.{stream}",
    ):
        assert allowed(p.publish, ok), ok
    for no in (
        subjects.site_beat(R, "s2"),
        subjects.state(R, "n9"),
        subjects.events(R, "n9"),
        subjects.assign(R, "e1"),
        subjects.job_log(R),
        subjects.api(R, "job.submit"),
        f"$JS.hub.API.CONSUMER.MSG.NEXT.{stream}.agent_n9",
        f"$JS.hub.API.CONSUMER.CREATE.{stream}.agent_e1.{subjects.assign(R, 'n9')}",
        f"$JS.hub.API.CONSUMER.CREATE.{stream}.agent_e1",
        f"$JS.hub.API.STREAM.DELETE.{stream}",
        f"$JS.hub.API.STREAM.CREATE.{subjects.log_stream(R)}",
        f"$JS.API.CONSUMER.MSG.NEXT.{stream}.agent_e1",  # only through the hub's domain
        f"$JS.ACK.{stream}.agent_n9.1",
        "mesh.us.sitebeat.s1",
    ):
        assert not allowed(p.publish, no), no
    for ok in ("_INBOX.site.s1.x", "_INBOX.agent.e1.y", subjects.task_logs(R, "e2")):
        assert allowed(p.subscribe, ok), ok
    for no in (
        "_INBOX.agent.n9.y",
        "_INBOX.site.s2.x",
        subjects.assign(R, "e1"),  # assignments come down as pull deliveries to an inbox
        subjects.state(R, "e1"),
        subjects.job_log(R),
        "mesh.us.state.e1",
    ):
        assert not allowed(p.subscribe, no), no
    assert p.allow_responses  # its agents answer log requests


def test_a_site_without_nodes_may_only_beat_and_probe():
    p = permissions(R, SITE)
    assert set(p.publish) == {subjects.site_beat(R, "s1"), "$JS.hub.API.INFO"}
    assert p.subscribe == ("_INBOX.site.s1.>",) and not p.allow_responses
    with pytest.raises(subjects.SubjectError):
        permissions(R, SITE, site_nodes=["a.b"])


def test_sites_open_leaf_links_only_and_everyone_else_client_connections():
    users = {u.user: u for u in server_users(R, [A, SITE], sites={"s1": ["e1"]})}
    assert users["CN=site:s1"].connection_types == ("LEAFNODE",)
    assert users["CN=agent:node-a"].connection_types == ("STANDARD",)
    assert subjects.state(R, "e1") in users["CN=site:s1"].publish
    text = ServerConfig(tls=TlsFiles("/c/ca", "/c/s", "/c/k"), users=list(users.values())).render()
    assert 'allowed_connection_types: ["LEAFNODE"]' in text
    assert Identity.parse("site:s1") == SITE and SITE.inbox_prefix == "_INBOX.site.s1"
