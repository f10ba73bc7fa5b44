"""The `mesh` command line: every command, flag and default in one place."""

from __future__ import annotations

import argparse
from collections.abc import Iterator

from mesh.cli import certs, completion, contexts, edge, fedview, infer, load, partition, sites
from mesh.cli import install as agent_install
from mesh.cli import ledger as agent_ledger

OUTPUTS = ("table", "json", "yaml", "wide")


def add_global_flags(p: argparse.ArgumentParser, *, suppress: bool) -> None:
    """The flags every command takes, before or after its subcommand (`mesh job list
    --json` as kubectl and nomad users type it). On subcommands their defaults are
    SUPPRESS, so a flag given there sets the value and an absent one leaves the
    top-level parser's value (or default) standing. A flag a subcommand already defines
    for itself (`up --insecure`, `certs issue --user`) is left to that subcommand."""
    g = p.add_argument_group("global options") if suppress else p
    flags: list[tuple[tuple[str, ...], dict]] = [
        (("--context",), {"metavar": "NAME", "help": "use this saved context (env MESH_CONTEXT)"}),
        (
            ("--nats",),
            {"metavar": "URL", "help": "NATS URL (env MESH_NATS_URL; default: the context)"},
        ),
        (
            ("--region",),
            {
                "help": "region (env MESH_REGION; default: the context or 'default'); 'all': "
                "every region, for job list|status, node list, pool list, cluster info"
            },
        ),
        (
            ("--certs",),
            {
                "metavar": "DIR",
                "help": "certificate directory; each component uses its identity's files there "
                "(env MESH_CERTS; default: the context)",
            },
        ),
        (
            ("--user",),
            {"help": "user the CLI acts as (env MESH_USER; default: the context or admin)"},
        ),
        (
            ("--insecure",),
            {
                "action": "store_true",
                "help": "no TLS, no client certificate (development; env MESH_INSECURE=1)",
            },
        ),
        (
            ("--json",),
            {"action": "store_true", "help": "machine-readable output (same as -o json)"},
        ),
        (
            ("-o", "--output"),
            {
                "choices": OUTPUTS,
                "help": "output format: table (default), json, yaml, or wide (every column)",
            },
        ),
        (
            ("--log-level",),
            {
                "type": str.lower,
                "choices": ["debug", "info", "warning", "error", "critical"],
                "help": "debug, info, warning or error (default: info for agent, "
                "coordinator and up; warning for client commands)",
            },
        ),
    ]
    taken = p._option_string_actions
    for names, kw in flags:
        if any(n in taken for n in names):
            continue
        if suppress:
            kw = {**kw, "default": argparse.SUPPRESS}
        g.add_argument(*names, **kw)


def subparsers(p: argparse.ArgumentParser) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    """A parser's direct subcommands, by name (aliases not repeated)."""
    seen: set[int] = set()
    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sp in action.choices.items():
                if id(sp) not in seen:
                    seen.add(id(sp))
                    yield name, sp


def _add_globals_everywhere(p: argparse.ArgumentParser) -> None:
    for _, sp in subparsers(p):
        add_global_flags(sp, suppress=True)
        _add_globals_everywhere(sp)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mesh", description="Mesh: schedule mixed work over NATS.")
    add_global_flags(p, suppress=False)
    sub = p.add_subparsers(dest="cmd", required=True)

    up = sub.add_parser("up", help="run a whole region on this machine until interrupted")
    up.add_argument(
        "--sim-nodes",
        type=int,
        default=None,
        help="simulated nodes to add (per region with --regions, default 2 there, else 0)",
    )
    up.add_argument("--candidates", type=int, default=2, help="coordinator candidates")
    up.add_argument("--port", type=int, default=4222, help="NATS port (0: any free port)")
    up.add_argument(
        "--state-dir", help="where NATS and the agent keep state (default $MESH_HOME/up)"
    )
    up.add_argument("--no-agent", action="store_true", help="no real agent for this machine")
    up.add_argument(
        "--insecure",
        dest="up_insecure",
        action="store_true",
        help="no TLS, no certificates, no permissions (development)",
    )
    up.add_argument(
        "--leafnodes",
        type=int,
        metavar="PORT",
        help="accept edge sites' leaf connections on PORT (loopback; 0: any free port); "
        "the region's JetStream becomes the domain 'hub' (edge/README.md)",
    )
    up.add_argument(
        "--site-nodes",
        action="append",
        default=[],
        metavar="S=NODE,NODE",
        help="with --leafnodes: site S (its certificate made, site:S) speaks for these nodes",
    )
    up.add_argument(
        "--nats-cluster",
        type=int,
        default=1,
        choices=[1, 3],
        help="NATS servers clustered on loopback (3: streams with 3 replicas)",
    )
    up.add_argument(
        "--regions",
        metavar="A,B,...",
        help="a federation: one nats-server per region joined by gateways (TLS), each "
        "region's coordinators and hollow nodes, no real agent; --port is the first "
        "region's, the others take the next ports (docs/federation.md)",
    )
    up.add_argument(
        "--inference-workers",
        type=int,
        default=0,
        metavar="N",
        help="also start an inference router and serve the numpy model with N CPU "
        "worker replicas, placed by the coordinator on this machine's agent",
    )

    demo = sub.add_parser("demo", help="start a throwaway region, run sample jobs, summarise")
    demo.add_argument("--sim-nodes", type=int, default=4)

    ag = sub.add_parser("agent", help="run the node agent")
    ag.add_argument("--node-id", help="default: the host name")
    ag.add_argument("--data-dir", help="default: $MESH_HOME/agent/<node-id>")
    ag.add_argument("--zone", default="")
    ag.add_argument(
        "--site",
        default="",
        help="this node belongs to edge site SITE: --nats is the site's leaf (mesh edge up), "
        "events are kept there while the region is cut off",
    )
    ag.add_argument("--label", action="append", default=[], metavar="KEY=VALUE")
    ag.add_argument("--heartbeat", type=float, default=1.0, help="seconds between heartbeats")
    ag.add_argument("--run-as", help="run task commands as this user")
    ag.add_argument(
        "--allow-root",
        action="store_true",
        help="let a root agent with no --run-as run task commands as root (refused otherwise)",
    )
    ag.add_argument(
        "--verify-key",
        metavar="PEM",
        help="coordinator's Ed25519 public key: refuse assignments whose signature fails "
        "(default: assignments.pub in the --certs directory, if there)",
    )
    ag.add_argument("--limits", default="auto", choices=["auto", "cgroup", "rlimit", "none"])
    ag.add_argument(
        "--address",
        default="",
        help="the address training peers reach this node's tasks at (default: the local IP "
        "of its route to NATS; 127.0.0.1 when NATS is on this host)",
    )
    ag.add_argument(
        "--ports",
        default="20000-32000",
        metavar="LO-HI",
        help="the ports the coordinator may give this node's tasks (default: 20000-32000)",
    )
    ag.add_argument(
        "--task-identity",
        metavar="DIR",
        help="where the worker identity's files are (DIR/ca.crt, DIR/worker-NAME.crt and "
        ".key): handed to tasks that ask for it (inference workers, a horovod launcher), "
        "never the agent's own",
    )
    ag.add_argument(
        "--task-identity-name",
        metavar="NAME",
        help="with --task-identity: the worker identity's name (default: the node id)",
    )
    ag.add_argument(
        "--simulate",
        type=int,
        default=0,
        metavar="N",
        help="run N simulated (hollow) nodes instead of a real agent",
    )
    ag.add_argument("--seed", type=int, default=0, help="inventory mix seed for --simulate")
    ag.add_argument(
        "--ledger",
        metavar="FILE",
        help="with --simulate: append every run to FILE as JSON lines (agent/ledger.py)",
    )
    ag.add_argument("--prefix", default="hollow", help="with --simulate: node ids PREFIX-NNNN")
    ag.add_argument(
        "--cpus",
        type=int,
        default=0,
        help="with --simulate: every node has this many cores (4 GiB each), no GPUs, "
        "instead of the standard mix (for like-for-like comparisons)",
    )
    ag.add_argument(
        "--kill-tasks-on-exit",
        action="store_true",
        help="stop running tasks when the agent stops (default: leave them to be re-adopted)",
    )

    co = sub.add_parser("coordinator", help="run a coordinator candidate")
    co.add_argument("--id", dest="candidate_id", default=None)
    co.add_argument("--lease-ttl", type=float, default=2.0)
    co.add_argument("--replicas", type=int, default=1, help="replicas of the region's streams")
    co.add_argument(
        "--suspect-after",
        type=float,
        default=3.0,
        metavar="SECONDS",
        help="a node silent this long gets no new placements",
    )
    co.add_argument(
        "--down-after",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="a node silent this long is down: its tasks are LOST and placed again",
    )
    co.add_argument(
        "--starve-after",
        type=float,
        default=None,
        metavar="SECONDS",
        help="a gang that has waited this long holds the line until it fits (starvation "
        "guard; default 30)",
    )
    co.add_argument(
        "--resize-every",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="an elastic training job is resized at most this often (after its last "
        "membership change)",
    )
    co.add_argument(
        "--progress-timeout",
        type=float,
        default=120.0,
        metavar="SECONDS",
        help="an elastic job whose progress stops this long after a membership change is requeued",
    )
    co.add_argument(
        "--signing-key",
        metavar="PEM",
        help="Ed25519 private key: sign every assignment "
        "(default: assignments.key in the --certs directory, if there)",
    )

    job = sub.add_parser("job", help="submit and manage jobs").add_subparsers(
        dest="job_cmd", required=True
    )
    run = job.add_parser("run", help="submit job specs (YAML); several in one request")
    run.add_argument("file", nargs="+", help="spec file, or - for stdin; several may be given")
    run.add_argument("--wait", action="store_true", help="wait; exit 0 only if all SUCCEEDED")
    run.add_argument("--timeout", type=float, default=3600.0, help="seconds --wait waits")
    run.add_argument(
        "--client-id",
        help="idempotency key (default: random); with several files, ID-0, ID-1, ... in order",
    )
    st = job.add_parser("status", help="a job's state, tasks and why it waits")
    st.add_argument("job_id")
    ls = job.add_parser("list", help="recent jobs")
    ls.add_argument("--state")
    ls.add_argument("--pool")
    ls.add_argument("--limit", type=int, default=50)
    kill = job.add_parser(
        "kill",
        help="kill jobs: by id, or every active job a selector picks",
        description="Kill jobs by id (several at once), or every PENDING/RUNNING job "
        "picked by --state and/or --pool, or all of them with --all. Requests go "
        "concurrently over one connection.",
    )
    kill.add_argument("job_id", nargs="*", help="jobs to kill")
    kill.add_argument("--state", choices=("PENDING", "RUNNING"), help="active jobs in this state")
    kill.add_argument("--pool", help="active jobs in this pool")
    kill.add_argument("--all", action="store_true", help="every active job")
    kill.add_argument("--reason", default="")
    upd = job.add_parser(
        "update",
        help="replace a running service's spec: its replicas are replaced one by one",
        description="Send a new spec for a running service (kind: service). Its replicas "
        "are replaced one by one: a new one started, the old one stopped once the new one "
        "is running (and healthy), as its update: {max_surge, max_unavailable} allow. The "
        "job is the active service of the spec's name, or --job ID.",
    )
    upd.add_argument("file", help="spec file, or - for stdin")
    upd.add_argument("--job", metavar="JOB_ID", help="the service to update (default: by name)")
    sc = job.add_parser(
        "scale",
        help="set an elastic training job's target size",
        description="Set the target size of an elastic training job (workers: {min, max}): "
        "the scheduler places its waiting tasks up to it, or stops its tasks above it "
        "(highest index first, never task 0), within [min, max].",
    )
    sc.add_argument("job_id")
    sc.add_argument("--workers", type=int, required=True, metavar="N", help="the new size")
    sc.add_argument("--reason", default="")
    ho = job.add_parser(
        "hosts",
        help="a training job's hosts, as a hostfile",
        description="The hosts of a training job's placed tasks, in task order: "
        "horovod `host:slots` (what horovodrun's host discovery script prints), mpi "
        "`host slots=N`, or plain hosts.",
    )
    ho.add_argument("job_id")
    ho.add_argument("--format", choices=("horovod", "mpi", "plain"), default="plain")
    lg = job.add_parser("logs", help="a task's log, from the agent that ran it")
    lg.add_argument("job_id")
    lg.add_argument(
        "--task",
        metavar="TASK",
        help="which task (default: the first): its full id (JOB.ROLE.INDEX), a unique "
        "prefix or suffix of it (e.g. ROLE.INDEX), its index (0) or its group's role "
        "when that group has one task",
    )
    lg.add_argument("--stderr", action="store_true")
    lg.add_argument("--tail", type=int, default=64 * 1024, help="bytes from the end")

    pool = sub.add_parser("pool", help="resource pools").add_subparsers(
        dest="pool_cmd", required=True
    )
    pa = pool.add_parser("apply", help="replace the pool tree with a YAML file's")
    pa.add_argument("file", help="pools file, or - for stdin")
    pool.add_parser(
        "list", help="pools with reservation, limit, share, demand, allocation, entitlement"
    )
    pg = pool.add_parser("get", help="one pool")
    pg.add_argument("path")

    node = sub.add_parser("node", help="nodes").add_subparsers(dest="node_cmd", required=True)
    node.add_parser("list", help="nodes with capacity and load")
    ng = node.add_parser("get", help="one node")
    ng.add_argument("node_id")

    cl = sub.add_parser("cluster", help="region").add_subparsers(dest="cluster_cmd", required=True)
    cl.add_parser("info", help="leader, term, node and job counts")

    partition.add_parser(sub)
    sites.add_parser(sub)  # `mesh site list`
    fedview.add_parser(sub)  # `mesh region list`
    edge.add_parser(sub)  # `mesh edge up`
    load.add_parser(sub)
    certs.add_parser(sub)
    agent_ledger.add_parser(agent_install.add_parsers(ag))  # `mesh agent install|...|ledger`
    infer.add_parsers(sub)
    contexts.add_parser(sub)
    completion.add_parser(sub)
    _add_globals_everywhere(p)  # last: subcommands added above (by any module) get them too
    return p
