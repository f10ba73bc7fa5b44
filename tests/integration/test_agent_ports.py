"""A real `mesh agent` process and a real nats-server, sent training runs directly (the
coordinator's side is not under test here): its heartbeat carries --address and --ports;
a run gets its files (contents, modes), its `@files/` references replaced, MESH_FILES_DIR
and MESH_PROGRESS_FILE; RUNNING carries its ports; what it writes to its progress file
comes back as RUNNING events with `progress`, at most one per 2 s; a port held on the
node, one outside its range, or a bad file name fails the attempt at once, naming it."""

from __future__ import annotations

import json
import os
import socket
import stat
import time

from agent.hollow import HollowFleet
from agent.service import Agent, AgentConfig
from agent.training import DEFAULT_PORT_RANGE
from mesh import subjects
from mesh.codec import decode, encode
from mesh.connect import close_quietly, connect
from mesh.schema import Assignment, NodeState, TaskEvent, TaskSpec, decode_task_events
from mesh.server import EmbeddedServer, ServerConfig
from workloads.lifecycle import ENDED
from workloads.spec import SimulatedRun

from .conftest import cli_env, eventually, run_mesh

NODE = "ports-1"
RANGE = (21000, 21999)

# What the run reports about itself (one JSON line), then progress 1..16, 0.25 s apart.
TASK = r"""
set -e
out="$1"; shift
"$1" > "$out.sh-ran"
{
  printf '{"files_dir": "%s", "progress_file": "%s", "arg": "%s", "hosts": "%s",' \
    "$MESH_FILES_DIR" "$MESH_PROGRESS_FILE" "$1" "$HOSTS"
  printf ' "master": "%s", "hostfile": "%s",' "$MASTER" "$(cat "$HOSTS")"
  printf ' "modes": "%s %s"}\n' "$(stat -c %a "$HOSTS")" "$(stat -c %a "$1")"
} > "$out"
i=1
while [ $i -le 16 ]; do echo " $i " > "$MESH_PROGRESS_FILE"; i=$((i+1)); sleep 0.25; done
"""


def _free_ports(n: int, held: set[int] = frozenset()) -> list[int]:
    found = []
    for port in range(RANGE[0] + 500, RANGE[1]):
        if port in held:
            continue
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("", port))
            except OSError:
                continue
        found.append(port)
        if len(found) == n:
            return found
    raise AssertionError("no free ports")


async def test_agent_process_checks_ports_writes_files_and_reports_progress(
    nats_server, procs, tmp_path
):
    root = ("--allow-root",) if os.geteuid() == 0 else ()
    data = tmp_path / "agent-data"
    procs(
        nats_server.url,
        *("agent", "--node-id", NODE, "--data-dir", str(data), *root),
        *("--address", "10.9.8.7", "--ports", f"{RANGE[0]}-{RANGE[1]}"),
        name="agent",
    )
    nc = await connect(nats_server.url, name="test")
    states: list[NodeState] = []
    events: list[TaskEvent] = []

    async def on_state(msg) -> None:
        states.append(decode(NodeState, msg.data))

    async def on_events(msg) -> None:
        events.extend(decode_task_events(msg.data)[1])

    await nc.subscribe(subjects.state("default", NODE), cb=on_state)
    await nc.subscribe(subjects.events_all("default"), cb=on_events)
    held = socket.socket()
    try:
        state = await eventually(lambda: states and states[-1], timeout=30)
        assert state.address == "10.9.8.7" and state.port_range == RANGE
        js = nc.jetstream()

        async def assign(task_id: str, spec: TaskSpec) -> None:
            a = Assignment("run", NODE, "job", task_id, 1, 1, time.time(), spec)
            await js.publish(
                subjects.assign("default", NODE),
                encode(a),
                stream=subjects.assign_stream("default"),
            )

        def of(task_id: str) -> list[TaskEvent]:
            return [e for e in events if e.task_id == task_id]

        def ended(task_id: str) -> TaskEvent | None:
            return next((e for e in of(task_id) if e.state in ENDED), None)

        held.bind(("0.0.0.0", 0))
        held.listen()
        held_port = held.getsockname()[1]
        # The kernel picks the held port from its ephemeral range: outside ours, so this
        # one also fails, first, on the range. One inside the range, held by the test:
        inside = socket.socket()
        inside.bind(("127.0.0.1", _free_ports(1)[0]))
        inside.listen()
        inside_port = inside.getsockname()[1]
        master, metrics = _free_ports(2, {inside_port})
        out = tmp_path / "report.json"
        marker = tmp_path / "must-not-run"
        never = ("sh", "-c", f"touch {marker}")
        await assign("clash", TaskSpec(argv=never, ports={"master": inside_port}))
        await assign("outside", TaskSpec(argv=never, ports={"metrics": held_port}))
        await assign("badname", TaskSpec(argv=never, files={"../escape": "x"}))
        await assign(
            "train",
            TaskSpec(
                argv=("sh", "-c", TASK, "task", str(out), "@files/hello.sh"),
                env={"HOSTS": "@files/hostfile", "MASTER": "x@files/kept"},
                ports={"master": master, "metrics": metrics},
                files={
                    "hostfile": "10.9.8.7 slots=2\n",
                    "hello.sh": "#!/bin/sh\necho hello from a file\n",
                },
            ),
        )
        clash = await eventually(lambda: ended("clash"), timeout=20)
        assert clash.state == "FAILED"
        assert f"port {inside_port} (master) is in use on this node" in clash.message
        outside = await eventually(lambda: ended("outside"))
        assert outside.state == "FAILED"
        assert f"port {held_port} (metrics) is outside this node's port range" in outside.message
        bad = await eventually(lambda: ended("badname"))
        assert bad.state == "FAILED" and "'../escape' is not a plain file name" in bad.message
        for task_id in ("clash", "outside", "badname"):
            assert [e.state for e in of(task_id)] in (["FAILED"], ["STARTING", "FAILED"])

        done = await eventually(lambda: ended("train"), timeout=30)
        assert done.state == "SUCCEEDED", done
        assert not marker.exists()  # no failed attempt ran its command
        report = json.loads(out.read_text())
        files_dir = report["files_dir"]
        assert files_dir.startswith(str(data)) and files_dir.endswith("/files")
        assert report["progress_file"] == f"{files_dir}/progress"
        assert report["arg"] == f"{files_dir}/hello.sh"
        assert report["hosts"] == f"{files_dir}/hostfile"
        assert report["master"] == "x@files/kept"  # only at the start of a value
        assert report["hostfile"] == "10.9.8.7 slots=2"
        assert report["modes"] == "644 755"
        assert (tmp_path / "report.json.sh-ran").read_text() == "hello from a file\n"
        assert stat.S_IMODE(os.stat(f"{files_dir}/hello.sh").st_mode) == 0o755

        running = [e for e in of("train") if e.state == "RUNNING"]
        assert running[0].progress == -1
        assert all(e.ports == {"master": master, "metrics": metrics} for e in running)
        progress = [e for e in running if e.progress >= 0]
        values = [e.progress for e in progress]
        # 16 writes over 4 s: one report at most every 2 s, each a newer value
        assert 2 <= len(values) <= 5, values
        assert values == sorted(set(values)) and all(1 <= v <= 16 for v in values)
        gaps = [b.ts - a.ts for a, b in zip(progress, progress[1:], strict=False)]
        assert all(g >= 1.9 for g in gaps), gaps
        inside.close()
    finally:
        held.close()
        await close_quietly(nc)


def test_mesh_agent_refuses_a_bad_port_range_or_address(tmp_path):
    env = cli_env(tmp_path)
    for flags, says in (
        (("--ports", "80-90"), "--ports 80-90: need 1024 <= LO <= HI <= 65535"),
        (("--ports", "abc"), "--ports 'abc': expected LO-HI"),
        (("--address", "a b"), "--address 'a b': expected an IP address or a host name"),
    ):
        done = run_mesh("--nats", "nats://127.0.0.1:1", "agent", *flags, env=env, timeout=30)
        assert done.returncode == 2, done.stderr
        assert says in done.stderr


async def test_default_address_and_hollow_nodes(nats_server, tmp_path):
    """An agent without --address on a loopback NATS advertises 127.0.0.1 and the default
    range; a hollow node does too, and reports a simulated run's ports with RUNNING
    (nothing bound: the same port on two of its nodes is fine)."""
    agent = Agent(AgentConfig(nats_server.url, node_id="plain", data_dir=str(tmp_path / "a")))
    fleet = HollowFleet(nats_server.url, count=2)
    nc = await connect(nats_server.url, name="test")
    events: list[TaskEvent] = []

    async def on_events(msg) -> None:
        events.extend(decode_task_events(msg.data)[1])

    await nc.subscribe(subjects.events_all("default"), cb=on_events)
    try:
        await agent.start()
        state = agent.node_state(agent.probe.sample())
        assert (state.address, state.port_range) == ("127.0.0.1", DEFAULT_PORT_RANGE)
        await fleet.start()
        hollow = fleet.nodes["hollow-0000"]._state("default", 1, time.time(), ())
        assert (hollow.address, hollow.port_range) == ("127.0.0.1", DEFAULT_PORT_RANGE)
        js = nc.jetstream()
        spec = TaskSpec(simulate=SimulatedRun(duration_s=None), ports={"master": 20001})
        for node in ("hollow-0000", "hollow-0001"):
            a = Assignment("run", node, "job", f"sim-{node}", 1, 1, time.time(), spec)
            await js.publish(
                subjects.assign("default", node),
                encode(a),
                stream=subjects.assign_stream("default"),
            )

        def running() -> list[TaskEvent]:
            got = [e for e in events if e.state == "RUNNING"]
            return got if len(got) == 2 else []

        for ev in await eventually(running):
            assert ev.ports == {"master": 20001} and ev.progress == -1
    finally:
        await fleet.stop()
        await agent.stop(kill_tasks=True)
        await close_quietly(nc)


def _host_ip() -> str:
    """This host's address on its default route (a UDP connect sends nothing), or
    127.0.0.1 on a host with none."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.77", 9))
            return s.getsockname()[0]
        except OSError:
            return "127.0.0.1"


async def test_default_address_is_the_route_to_nats(tmp_path):
    """NATS reached over the host's own network address: the agent advertises that
    address (what a peer on another host would use), not 127.0.0.1."""
    ip = _host_ip()
    server = EmbeddedServer(ServerConfig(host="0.0.0.0", store_dir=str(tmp_path / "nats")))
    server.start()
    agent = Agent(
        AgentConfig(
            f"nats://{ip}:{server.config.port}", node_id="routed", data_dir=str(tmp_path / "a")
        )
    )
    try:
        await agent.start()
        assert agent.node_state(agent.probe.sample()).address == ip
    finally:
        await agent.stop()
        server.stop()
