"""The real node agent: probes the host, publishes its state, runs assigned tasks.

It remembers every task it accepted in its SQLite store *before* starting it, so a
redelivered assignment is recognised and never started twice, and a restarted agent
re-adopts the processes it left running and reports what it still owes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import socket
import sqlite3
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from agent import health
from agent.access import make_dirs
from agent.autonomy import RunKeeper
from agent.executor import ExecError, ExecSpec, ExitStatus, ProcessExecutor, ProcessHandle
from agent.gpu import (
    NO_GPU,
    GpuGrant,
    GpuGrantError,
    GpuWatchdog,
    Overuse,
    WatchedTask,
    enforcement,
    gpu_grant,
    mps_daemon_up,
    mps_pipe_dir,
    task_env,
)
from agent.link import SITE_ACK_WAIT_S, AssignmentFeed, AssignmentMessage, publish_event
from agent.probe import GpuInfo, GpuProbe, HostProbe, HostSample
from agent.store import TaskRecord, TaskStore
from agent.training import (
    DEFAULT_PORT_RANGE,
    ProgressGate,
    check_address,
    check_port_range,
    connection_address,
    expand_argv,
    expand_env,
    files_env,
    ports_problem,
    progress_loop,
    task_nats_url,
)
from mesh import subjects, tls_env
from mesh.codec import WireError, decode, encode
from mesh.connect import ClientTls, close_quietly, connect, describe, endpoint
from mesh.logs import fields
from mesh.schema import (
    Assignment,
    ErrorCode,
    GpuProcessInfo,
    GpuStatus,
    HealthProbe,
    LogsRequest,
    NodeState,
    Resources,
    TaskEvent,
    error_reply,
    ok,
)
from mesh.signing import AssignmentRefused, key_id, load_verify_key, open_message
from mesh.streams import node_streams
from workloads.lifecycle import TaskState

log = logging.getLogger("mesh.agent")
# aiosqlite logs every statement with its parameters at DEBUG, and the task store's
# parameters are assignments, env values (secrets) included: never below INFO.
logging.getLogger("aiosqlite").setLevel(logging.INFO)

ENDED_HERE = frozenset({"SUCCEEDED", "FAILED", "KILLED"})
# A task over its GPU memory grant is hurting its neighbours now: a short grace only.
GPU_EVICT_GRACE_S = 1.0


class AgentStartError(RuntimeError):
    """The agent cannot work as configured (its message says why and what to change):
    it must not start, so that a supervisor reports it rather than a node that
    heartbeats and fails every task."""


def default_node_id() -> str:
    name = re.sub(r"[^A-Za-z0-9_-]", "-", socket.gethostname())[:64].strip("-")
    return name or "node"


@dataclass
class AgentConfig:
    nats_url: str
    region: str = "default"
    node_id: str = field(default_factory=default_node_id)
    zone: str = ""
    labels: dict[str, str] = field(default_factory=dict)
    data_dir: str = ""
    heartbeat_s: float = 1.0
    run_as: str | None = None
    allow_root: bool = False  # a root agent with no run_as refuses tasks unless this is set
    verify_key: str | None = None  # coordinator's Ed25519 public key (PEM): verify assignments
    limits: str = "auto"
    kill_grace_s: float = 5.0
    gpu_watchdog_s: float = 1.0  # poll period of the GPU memory watchdog
    tls: ClientTls | None = None  # its certificate (agent:NODE) on a secure mesh
    # The identity handed to tasks that ask for it (inference workers: worker:NAME), never
    # the agent's own. None on a secure mesh: such tasks are refused.
    task_tls: ClientTls | None = None
    # The edge site this node belongs to (edge/README.md; "": none). A site agent is
    # connected to its site's leaf: events go to the site's stream there, assignments
    # are read from the region's stream through the hub's JetStream domain.
    site: str = ""
    # Training (docs/training.md): the address its tasks' peers reach it at ("": the local
    # IP of its route to NATS, see agent.training.route_address) and the ports the
    # coordinator may give its tasks.
    address: str = ""
    port_range: tuple[int, int] = DEFAULT_PORT_RANGE


class Agent:
    """``gpu_probe``: where GPUs and their per-process memory come from (NVML by default;
    tests hand in a stand-in, as no GPU is needed to test what the agent does with one)."""

    def __init__(self, config: AgentConfig, *, gpu_probe: GpuProbe | None = None) -> None:
        self.config = config
        self.region = subjects.token(config.region, "region")
        self.node_id = subjects.token(config.node_id, "node id")
        self.site = subjects.token(config.site, "site") if config.site else ""
        self.data_dir = Path(config.data_dir or Path.home() / ".mesh" / "agent" / self.node_id)
        self.port_range = check_port_range(tuple(config.port_range), "port_range")
        self._address = check_address(config.address, "address") if config.address else ""
        self._route_address = "127.0.0.1"  # the last one seen on a connection
        # RUNNING attempts' ports, sent with each of their RUNNING events (resends too).
        self.task_ports: dict[tuple[str, int], dict[str, int]] = {}
        self._progress: dict[tuple[str, int], asyncio.Task[None]] = {}  # files read
        self.handles: dict[tuple[str, int], ProcessHandle] = {}
        self.owed: set[tuple[str, int]] = set()  # ended; outcome not acknowledged yet
        self.killing: set[tuple[str, int]] = set()
        self.seq = 0
        self.note = ""
        # Assignment signatures: with a key, nothing unverified is acted on (see mesh.signing).
        self.verify_key = load_verify_key(config.verify_key) if config.verify_key else None
        self.verify_key_id = key_id(self.verify_key) if self.verify_key is not None else ""
        self.refused = 0  # assignments refused by verification, shown in the heartbeat note
        self.storage_error = ""  # the last task store write that failed, until one works
        self.last_refused = ""
        self._tasks: list[asyncio.Task[None]] = []
        self._monitors: set[asyncio.Task[None]] = set()
        self._health: dict[tuple[str, int], asyncio.Task[None]] = {}  # replicas checked
        self._report_lock = asyncio.Lock()
        self.nc = None
        self.gpus = gpu_probe if gpu_probe is not None else GpuProbe()
        # What each GPU gets (uuid -> "mig"/"mps"/"watchdog"/"none"), as of the last sample.
        self.gpu_enforcement: dict[str, str] = {}
        self._mps_dir = mps_pipe_dir(os.environ)
        # Grants of running tasks; a task whose grant could not be read is absent (unwatched).
        self._gpu_grants: dict[tuple[str, int], GpuGrant] = {}
        self.watchdog: GpuWatchdog | None = None
        self.runs = RunKeeper(self)  # the ledger, and in-place restarts while cut off

    async def start(self) -> None:
        if self.config.run_as is None:
            self.data_dir.mkdir(parents=True, exist_ok=True)
        else:
            make_dirs(self.data_dir)  # what it creates, the task user can traverse
        self.store = await TaskStore.open(self.data_dir / "agent.db")
        if self.store.recovered_from:
            self.note = f"task store was corrupt; moved aside to {self.store.recovered_from}"
            log.error(self.note)
        self.executor = ProcessExecutor(
            self.data_dir / "tasks",
            run_as=self.config.run_as,
            limits=self.config.limits,
            allow_root=self.config.allow_root,
            task_env=self.task_env(),
            task_identity=self.task_identity_env(),
        )
        await self._check_task_user()
        if self.executor.root_refusal:
            log.warning(
                "agent is root and its tasks would run as root: it offers no capacity; "
                "restart it with --run-as USER (an unprivileged user) or --allow-root"
            )
        self.gpus.open()
        self.probe = HostProbe(self.data_dir, self.gpus)
        self._assess_gpus(self.gpus.sample())  # before _readopt may launch a task
        self.nc = await connect(
            self.config.nats_url,
            name=f"agent:{self.node_id}",
            tls=self.config.tls,
            checked_start=True,
        )
        # the events' stream (the leaf's, at a site) and the region's streams
        self.js, self.hub_js = await node_streams(self.nc, self.region, self.site)
        await self.runs.uplink.start(self.nc, self.region, self.config.site)
        await self._readopt()
        await self._stop_orphans()
        if self.gpus.is_open:
            # It measures only GPUs that MIG or MPS do not cover, and idles when none is left,
            # so a daemon that comes or goes later changes what it watches, not whether it runs.
            self.watchdog = GpuWatchdog(
                self.gpus.process_memory,
                self._gpu_tasks,
                self._gpu_overuse,
                watched=self._watchdog_gpus,
                interval_s=self.config.gpu_watchdog_s,
            )
            await self.watchdog.start()
        self._logs_sub = await self.nc.subscribe(
            subjects.task_logs(self.region, self.node_id), cb=self._serve_logs
        )
        self._say_verifying()
        self.feed = AssignmentFeed(
            self.hub_js,
            self.region,
            self.node_id,
            self._on_assignment,
            **({"ack_wait": SITE_ACK_WAIT_S} if self.site else {}),
        )
        if self.site:  # a long poll across the site's link, kicked when the link is back
            self.feed.wait_s = self.feed.site_wait_s
            self.runs.uplink.on_back = self.feed.kick
        await self.feed.start()
        self._tasks = [
            asyncio.create_task(self._heartbeat_loop(), name="heartbeat"),
            asyncio.create_task(self._report_loop(), name="reporter"),
        ]
        await self.nc.check_permissions()  # a wrong region is denied these subscriptions
        log.info(
            "agent %s started in region %s, connected to %s (limits: %s)",
            self.node_id,
            self.region,
            describe(self.nc),
            self.executor.limit_mode,
            extra=fields(event="started", process="agent", region=self.region, **endpoint(self.nc)),
        )

    async def _check_task_user(self) -> None:
        """Refuse to start when the task user cannot write its tasks' exit status under
        the data dir: each task would look fine while this agent runs and turn into a
        failure of unknown outcome after its next restart."""
        problem = self.executor.task_user_problem()
        if problem:
            await self.store.close()
            raise AgentStartError(
                f"data dir {self.data_dir}: {problem}; use a --data-dir that user can "
                "reach (e.g. /var/lib/mesh/agent) or open up that directory"
            )

    def refusing(self) -> str:
        """Why this node takes no tasks ("" when it does), sent in every heartbeat: the
        coordinator places nothing on it and says why in a waiting job's reason."""
        executor = getattr(self, "executor", None)  # None before start()
        return executor.root_refusal if executor is not None else ""

    def _say_verifying(self) -> None:
        """One line on whether assignments are verified: an agent that verifies while its
        coordinators do not sign runs nothing, and one that does not verify on a secure
        mesh runs whatever reaches its assignment subject."""
        if self.verify_key is not None:
            log.info(
                "verifying assignment signatures with %s (key %s)",
                self.config.verify_key,
                self.verify_key_id,
            )
        else:
            log.warning(
                "assignments are NOT verified: this agent runs any command published on its "
                "assignment subject; start it with --certs DIR (holding assignments.pub) or "
                "--verify-key FILE"
            )

    def task_env(self) -> dict[str, str]:
        """What every task is told about where it runs: this agent's NATS (no credentials
        in it: agent.training.task_nats_url) and region."""
        return {"MESH_NATS_URL": task_nats_url(self.config.nats_url), "MESH_REGION": self.region}

    def task_identity_env(self) -> dict[str, str] | None:
        """The task identity's files, for tasks that ask (`ProcessExecutor._environment`):
        {} on an insecure mesh (nothing to hand over), None on a secure one without a
        task identity (those tasks are refused)."""
        t = self.config.task_tls
        if t is None:
            return {} if self.config.tls is None else None
        return tls_env.to_env(t)  # MESH_TLS_CA/CERT/KEY (absolute), MESH_INBOX_PREFIX

    async def stop(self, kill_tasks: bool = False) -> None:
        """Stop the agent. Tasks keep running (a restarted agent re-adopts them) unless
        `kill_tasks`, which is what `mesh up` wants when it shuts everything down."""
        if kill_tasks:
            if hasattr(self, "feed"):
                await self.feed.stop()  # first, so that nothing starts during the kills
            # The executor's own list too: a task whose start was cut short by the stop
            # runs, but never made it into self.handles.
            live = {h.task_id: h for h in (*self.executor.running(), *self.handles.values())}
            await asyncio.gather(
                *(self.executor.kill(h, 1.0) for h in live.values()), return_exceptions=True
            )
            await asyncio.sleep(0)
        for task in self._tasks:
            task.cancel()
        if self.watchdog is not None:
            await self.watchdog.stop()  # before NVML is shut down under it
            self.watchdog = None
        if hasattr(self, "feed"):
            await self.feed.stop()
        watchers = [*self._health.values(), *self._progress.values()]
        self._health.clear()
        self._progress.clear()
        for task in [*self._tasks, *self._monitors, *watchers]:
            if not task.done():
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await self.runs.uplink.stop()
        if self.nc is not None:
            await close_quietly(self.nc)
        self.gpus.close()
        await self.store.close()

    # ------------------------------------------------------------ state

    def node_state(self, sample: HostSample) -> NodeState:
        self.seq += 1
        levels = self._assess_gpus(sample.gpus)
        gpus = tuple(
            GpuStatus(
                g.index,
                g.uuid,
                g.model,
                g.memory_total,
                g.memory_used,
                max(0, min(100, g.utilization)),
                levels.get(g.uuid, "none"),
                tuple(GpuProcessInfo(p.pid, p.used_memory) for p in g.processes[:256]),
            )
            for g in sample.gpus
        )
        capacity = Resources(
            cpu=sample.cpu_count * 1000,
            memory=sample.memory_total,
            disk=sample.disk_total,
            gpu=1000 * len(gpus),
            gpu_memory=sum(g.memory_total for g in gpus),
        )
        return NodeState(
            node_id=self.node_id,
            region=self.region,
            seq=self.seq,
            ts=time.time(),
            capacity=capacity,
            zone=self.config.zone,
            simulated=False,
            labels=dict(self.config.labels),
            cpu_percent=min(100.0, sample.cpu_percent),
            load1=sample.load1,
            memory_used=sample.memory_used,
            disk_used=sample.disk_used,
            gpus=gpus,
            cpu_pressure=sample.cpu_pressure,
            mem_pressure=sample.mem_pressure,
            # Also what ended with its outcome not yet stored: while the events stream
            # is away heartbeats still get through, and a task missing from them while
            # RUNNING in the log is declared LOST and run again.
            tasks=tuple(f"{t}#{a}" for t, a in (*self.handles, *self.owed)),
            note=self._node_note(),
            refusing=self.refusing(),
            verify_key=self.verify_key_id,
            site=self.site,
            address=self.address(),
            port_range=self.port_range,
        )

    def address(self) -> str:
        """--address, else the local IP of the current connection to NATS (asked again each
        heartbeat: a reconnect to another server may take another route)."""
        if self._address:
            return self._address
        seen = connection_address(self.nc) if self.nc is not None else ""
        if seen:
            self._route_address = seen
        return self._route_address

    def _assess_gpus(self, gpus: tuple[GpuInfo, ...]) -> dict[str, str]:
        """What each GPU's tasks are held to, judged afresh every sample: an MPS daemon
        that died must stop being claimed (its clients silently run without limits)."""
        mps = mps_daemon_up(self._mps_dir) if gpus else False
        nvml = self.gpus.is_open
        self.gpu_enforcement = {
            g.uuid: enforcement(mig_enabled=g.mig_enabled, mps=mps, nvml=nvml) for g in gpus
        }
        return self.gpu_enforcement

    async def _heartbeat_loop(self) -> None:
        subject = subjects.state(self.region, self.node_id)
        if self.site:  # site-local: the site link relays what the region acts on
            subject = subjects.site_state(self.region, self.site, self.node_id)
        while True:
            try:
                await self.nc.publish(subject, encode(self.node_state(self.probe.sample())))
            except Exception as exc:
                log.debug("heartbeat not sent: %s", exc)
            await asyncio.sleep(self.config.heartbeat_s)

    # ------------------------------------------------------------ assignments

    def _node_note(self) -> str:
        parts = [self.note] if self.note else []
        if self.refused:
            parts.append(f"refused {self.refused} assignments; last: {self.last_refused}")
        if self.storage_error:
            parts.append(f"task store not writable: {self.storage_error}")
        return "; ".join(parts)[:1024]

    def _stored(self, exc: BaseException | None) -> None:
        """Track whether the task store takes writes (a full disk): shown in the node's
        note, cleared by the next write that works."""
        if exc is None:
            self.storage_error = ""
            return
        if not self.storage_error:
            log.error("task store write failed: %s", exc)
        self.storage_error = str(exc)[:200] or type(exc).__name__

    async def _on_assignment(self, m: AssignmentMessage) -> None:
        for a, refused in open_message(m, self.verify_key, self.node_id, time.time()):
            if refused is not None:
                # Acknowledged with the rest: a refusal is final, redelivery would not
                # change it.
                await self._refuse(a, refused)
            else:
                await self._act(a)

    async def _act(self, a: Assignment) -> None:
        if a.kind == "kill":
            await self._kill(a)
            return
        rec = TaskRecord(
            task_id=a.task_id,
            attempt=a.attempt,
            job_id=a.job_id,
            state="STARTING",
            assignment=encode(a),
            updated=time.time(),
        )
        try:
            fresh = await self.store.insert_if_new(rec)
        except (sqlite3.Error, OSError) as exc:
            # Not recorded, so not started (a task runs only once it is on disk): the
            # attempt fails here, and the coordinator places it again, maybe elsewhere.
            self._stored(exc)
            await self._report_only(
                rec, "FAILED", f"not started: this node cannot record it ({exc})"
            )
            return
        self._stored(None)
        if not fresh:
            return  # redelivered: we already have it, and never start a task twice
        await self._launch(rec, a)

    async def _refuse(self, a: Assignment, exc: AssignmentRefused) -> None:
        """Not acted on, counted, and (a run's) reported as its attempt's failure with the
        reason, so the job says why instead of sitting PLACED. Only a run the coordinator
        really issued (signature good, refused for its age) is also recorded: a forged
        or unsigned one never touches the store (recorded, it would block the genuine run
        of that attempt), and the leader credits its report only where its own run of
        that attempt would have been refused too (mesh.signing.refusal_credited), so a
        forgery naming a real attempt cannot fail it."""
        self.refused += 1
        stamp = time.strftime("%H:%M:%S", time.gmtime())
        self.last_refused = f"{a.kind} {a.task_id[:64]}#{a.attempt} {exc.reason} at {stamp}Z"
        log.warning("assignment refused: %s", exc)
        if a.kind != "run" or not exc.reported:
            return
        rec = TaskRecord(
            task_id=a.task_id,
            attempt=a.attempt,
            job_id=a.job_id,
            state="FAILED",
            assignment=b"",
            updated=time.time(),
        )
        ev = replace(
            self._event(rec, "FAILED", message=f"refused by node {self.node_id}: {exc}"),
            refused=exc.reason,
            verify_key=self.verify_key_id,
        )
        if exc.genuine:
            try:
                if not await self.store.insert_if_new(rec):
                    return  # a replay of an attempt we had
                self.owed.add((rec.task_id, rec.attempt))
                await self._report(rec, ev)  # stored: the reporter resends it if need be
                return
            except (sqlite3.Error, OSError) as err:
                self._stored(err)  # not on disk, but its attempt must still be failed
        with contextlib.suppress(Exception):  # not stored: sent once (the note says it too)
            await publish_event(self.js, self.region, ev, self.site)

    async def _launch(self, rec: TaskRecord, a: Assignment) -> None:
        spec = a.spec
        if spec is None or spec.simulate is not None or not spec.argv:
            await self._finish(
                rec,
                "FAILED",
                message="refused: a real node runs only tasks "
                "with a command (simulated tasks belong on hollow nodes)",
            )
            return
        try:
            grant = gpu_grant(spec.resources.gpu, spec.resources.gpu_memory, spec.gpu_uuids)
        except GpuGrantError as exc:
            await self._finish(rec, "FAILED", message=f"refused: {exc}")
            return
        if spec.ports:
            problem = ports_problem(spec.ports, self.port_range)
            if problem:
                await self._finish(rec, "FAILED", message=f"could not start: {problem}")
                return
        exec_id = _exec_id(a.task_id, a.attempt)
        files_dir = str(self.executor.files_dir(exec_id))
        env = expand_env(dict(spec.env), files_dir)
        env.update(files_env(files_dir))
        env.update(self._gpu_env(grant))  # after the task's own: a task cannot widen its grant
        exec_spec = ExecSpec(
            task_id=exec_id,
            argv=expand_argv(spec.argv, files_dir),
            env=tuple(sorted(env.items())),
            cwd=spec.workdir,
            cpu_milli=spec.resources.cpu,
            memory_bytes=spec.resources.memory,
            max_run_time_s=spec.max_run_time_s,
            files=tuple(sorted(spec.files.items())),
        )
        # STARTING goes out while the process starts: nothing on the way to RUNNING waits
        # for it, and it is sent before RUNNING so the two arrive in order.
        starting = asyncio.ensure_future(self._report(rec, self._event(rec, "STARTING")))
        launched_at = time.time()  # the ledger's start (RunKeeper.started)
        try:
            handle = await self.executor.start(exec_spec)
        except ExecError as exc:
            await starting
            await self._finish(rec, "FAILED", message=f"could not start: {exc}")
            return
        rec.pid, rec.start_time, rec.state = handle.pid, handle.start_time, "RUNNING"
        try:
            await self.store.update(
                a.task_id,
                a.attempt,
                pid=handle.pid,
                start_time=handle.start_time,
                state="RUNNING",
                updated=time.time(),
            )
        except (sqlite3.Error, OSError) as exc:
            self._stored(exc)  # it runs and is watched; only a restart would forget it
        await self.runs.started(a.task_id, a.attempt, launched_at)
        self.runs.launched((a.task_id, a.attempt), exec_spec, a.retries_left)
        await starting
        self.task_ports[(rec.task_id, rec.attempt)] = dict(spec.ports)
        await self._report(rec, self._event(rec, "RUNNING"))
        self._monitor(rec, handle, grant)
        self._check_health(rec, exec_spec, spec.health)
        self._watch_progress(rec)

    def _watch_progress(self, rec: TaskRecord) -> None:
        """Report what the task writes to $MESH_PROGRESS_FILE (agent.training.ProgressGate)
        as RUNNING events with `progress`, until it ends."""
        key = (rec.task_id, rec.attempt)
        path = self.executor.files_dir(_exec_id(*key)) / "progress"
        gate = ProgressGate()

        async def send(value: int) -> None:
            ev = replace(self._event(rec, "RUNNING"), progress=value)
            try:
                await publish_event(self.js, self.region, ev, self.site)
            except Exception as exc:  # the next change is reported anyway
                log.info("progress %d of %s#%d not sent: %s", value, *key, exc)

        task = asyncio.create_task(progress_loop(path, send, gate), name=f"progress:{key[0]}")
        self._progress[key] = task
        self._monitors.add(task)
        task.add_done_callback(self._monitors.discard)

    def _check_health(
        self, rec: TaskRecord, exec_spec: ExecSpec, probe: HealthProbe | None
    ) -> None:
        """A service replica's health check, run beside it until it ends (agent/health.py)."""
        if probe is None or not probe.argv:
            return
        key = (rec.task_id, rec.attempt)
        files_dir = str(self.executor.files_dir(exec_spec.task_id))
        argv = expand_argv(probe.argv, files_dir)  # it may name the run's files too
        check_spec = replace(exec_spec, argv=argv, max_run_time_s=None, files=())

        async def check() -> tuple[bool, str]:
            return await self.executor.check(check_spec, probe.timeout_s)

        async def report(verdict: str, seq: int, why: str) -> None:
            message = f"health check: {verdict}" + (f" ({why})" if why else "")
            ev = replace(
                self._event(rec, "RUNNING", message=message), health=verdict, health_seq=seq
            )
            await publish_event(self.js, self.region, ev, self.site)

        loop = health.check_loop(
            check, report, probe.interval_s, probe.healthy_after, probe.unhealthy_after
        )
        task = asyncio.create_task(loop, name=f"health:{rec.task_id}")
        self._health[key] = task
        self._monitors.add(task)
        task.add_done_callback(self._monitors.discard)

    def _gpu_env(self, grant: GpuGrant) -> dict[str, str]:
        under_mps = bool(grant.uuids) and all(
            self.gpu_enforcement.get(u) == "mps" for u in grant.uuids
        )
        return task_env(grant, mps_pipe_dir=self._mps_dir if under_mps else None)

    def _event(
        self,
        rec: TaskRecord,
        state: str,
        exit_code: int | None = None,
        signal: int | None = None,
        message: str = "",
        log_tail: str = "",
    ) -> TaskEvent:
        ports = self.task_ports.get((rec.task_id, rec.attempt), {}) if state == "RUNNING" else {}
        return TaskEvent(
            self.node_id,
            rec.job_id,
            rec.task_id,
            rec.attempt,
            TaskState(state),
            time.time(),
            exit_code,
            signal,
            message[:4096],
            log_tail[-4096:],
            ports=dict(ports),
        )

    async def _kill(self, a: Assignment) -> None:
        key = (a.task_id, a.attempt)
        handle = self.handles.get(key)
        if handle is not None:
            if key not in self.killing:
                # In the background: the grace period must not stall the assignment feed.
                self.killing.add(key)
                task = asyncio.create_task(self.executor.kill(handle, a.grace_s))
                self._monitors.add(task)
                task.add_done_callback(self._monitors.discard)
            return
        rec = await self.store.get(a.task_id, a.attempt)
        if rec is None:
            # Killed before its run arrived: leave a tombstone so the run is never started.
            rec = TaskRecord(
                task_id=a.task_id,
                attempt=a.attempt,
                job_id=a.job_id,
                state="KILLED",
                assignment=b"",
                updated=time.time(),
            )
            if await self.store.insert_if_new(rec):
                await self._finish(rec, "KILLED", message="killed before it started")

    def _monitor(self, rec: TaskRecord, handle: ProcessHandle, grant: GpuGrant | None) -> None:
        self.handles[(rec.task_id, rec.attempt)] = handle
        if grant is not None:
            self._gpu_grants[(rec.task_id, rec.attempt)] = grant
        task = asyncio.create_task(self._watch(rec, handle), name=f"task:{rec.task_id}")
        self._monitors.add(task)
        task.add_done_callback(self._monitors.discard)

    async def _watch(self, rec: TaskRecord, handle: ProcessHandle) -> None:
        key = (rec.task_id, rec.attempt)
        rerun = await self.runs.rerun(key, handle, await self.executor.wait(handle))
        status = rerun.status
        for watching in (self._health.pop(key, None), self._progress.pop(key, None)):
            if watching is not None:
                watching.cancel()
        self.task_ports.pop(key, None)
        self.handles.pop(key, None)
        self._gpu_grants.pop(key, None)
        self.killing.discard(key)
        state, message = _outcome(status)
        message = "; ".join(m for m in (message, rerun.message) if m)
        await self.runs.ended(rec.task_id, rec.attempt, state)
        await self._finish(
            rec,
            state,
            exit_code=status.exit_code,
            signal=status.signal,
            message=message,
            log_tail=status.log_tail,
        )

    # ------------------------------------------------------------ GPU watchdog

    def _watchdog_gpus(self) -> list[str]:
        return [u for u, level in self.gpu_enforcement.items() if level == "watchdog"]

    def _gpu_tasks(self) -> list[WatchedTask]:
        """Every running task with a known grant, GPU or not: a task granted no GPU
        holds no GPU memory, and one that does takes it from tasks that were granted it."""
        return [
            WatchedTask(key, grant, self.executor.processes(handle))
            for key, handle in list(self.handles.items())
            if (grant := self._gpu_grants.get(key)) is not None
        ]

    async def _gpu_overuse(self, found: list[Overuse]) -> None:
        for over in found:
            key = over.key  # one of self.handles' keys: _gpu_tasks made it so
            handle = self.handles.get(key)
            if handle is None or key in self.killing:
                continue  # ended meanwhile, or already being killed (by anyone)
            self.killing.add(key)
            reason = f"killed by the GPU watchdog: {over.message}"
            log.warning("task %s %s", key, reason)
            task = asyncio.create_task(self.executor.kill(handle, GPU_EVICT_GRACE_S, reason=reason))
            self._monitors.add(task)
            task.add_done_callback(self._monitors.discard)

    # ------------------------------------------------------------ reporting

    async def _transition(self, rec: TaskRecord, state: str) -> None:
        rec.state = state
        await self.store.update(rec.task_id, rec.attempt, state=state, updated=time.time())
        await self._report(rec, self._event(rec, state))

    async def _finish(
        self,
        rec: TaskRecord,
        state: str,
        *,
        exit_code: int | None = None,
        signal: int | None = None,
        message: str = "",
        log_tail: str = "",
    ) -> None:
        rec.state, rec.exit_code = state, exit_code
        self.owed.add((rec.task_id, rec.attempt))
        try:
            await self.store.update(
                rec.task_id, rec.attempt, state=state, exit_code=exit_code, updated=time.time()
            )
            self._stored(None)
        except (sqlite3.Error, OSError) as exc:
            self._stored(exc)  # the outcome still goes to the coordinator, just not to disk
        await self._report(rec, self._event(rec, state, exit_code, signal, message, log_tail))

    async def _report_only(self, rec: TaskRecord, state: str, message: str) -> None:
        rec.state = state
        await self._report(rec, self._event(rec, state, None, None, message, ""))

    async def _report(self, rec: TaskRecord, ev: TaskEvent) -> None:
        try:
            await publish_event(self.js, self.region, ev, self.site)
        except Exception as exc:
            log.info("event %s/%s not sent yet: %s", rec.task_id, ev.state, exc)
            return  # the reporter loop resends from the store
        if ev.state in ENDED_HERE:
            self.owed.discard((rec.task_id, rec.attempt))
        try:
            await self.store.update(rec.task_id, rec.attempt, reported=str(ev.state))
        except (sqlite3.Error, OSError) as exc:
            self._stored(exc)  # sent; at worst the reporter sends it again (deduplicated)

    async def _report_loop(self) -> None:
        """Resend what the store says is still owed (a crash, or NATS away)."""
        while True:
            await asyncio.sleep(1.0)
            try:
                for rec in await self.store.active():
                    if rec.reported == rec.state:
                        continue
                    tail = ""
                    if rec.state in ENDED_HERE:
                        raw = self.executor.read_log(
                            _exec_id(rec.task_id, rec.attempt), "stderr", 2048
                        )
                        tail = raw.decode(errors="replace")
                    message = "reported after agent restart or reconnect"
                    ev = self._event(rec, rec.state, rec.exit_code, None, message, tail)
                    await self._report(rec, ev)
            except Exception as exc:
                log.warning("reporter: %s", exc)

    # ------------------------------------------------------------ restart

    async def _readopt(self) -> None:
        for rec in await self.store.active():
            if rec.state in ENDED_HERE:
                if rec.reported != rec.state:
                    self.owed.add((rec.task_id, rec.attempt))
                continue  # only a report is owed: the reporter loop sends it
            exec_id = _exec_id(rec.task_id, rec.attempt)
            pid, start_time = rec.pid, rec.start_time
            if pid is None:
                # Died between start() and storing the pid: the executor wrote both down
                # before it let the command run.
                recorded = self.executor.recorded(exec_id)
                if recorded is not None:
                    pid, start_time = recorded.pid, recorded.start_time
            if pid is not None and start_time is not None:
                handle = self.executor.adopt(exec_id, pid, start_time)
                if handle is not None:
                    log.info("re-adopted %s#%d (pid %d)", rec.task_id, rec.attempt, pid)
                    await self.runs.readopted(rec.task_id, rec.attempt, start_time)
                    self.task_ports[(rec.task_id, rec.attempt)] = _stored_ports(rec)
                    if rec.state != "RUNNING":
                        await self._transition(rec, "RUNNING")
                    self._monitor(rec, handle, _stored_grant(rec))
                    self._check_readopted(rec)
                    self._watch_progress(rec)
                    continue
                await self._finish_later(
                    rec,
                    "FAILED",
                    "exit status unknown: the task ended while the agent was down "
                    "and left no exit file",
                )
                continue
            # Accepted but its command was never released: it has not run, so start it now.
            try:
                assignment = decode(Assignment, rec.assignment)
            except WireError:
                await self._finish_later(
                    rec,
                    "FAILED",
                    "agent restarted before the task started and its assignment is unreadable",
                )
                continue
            await self._launch(rec, assignment)

    def _check_readopted(self, rec: TaskRecord) -> None:
        """A re-adopted replica's health check starts again (its verdicts from 1: the
        coordinator takes the first as news)."""
        try:
            a = decode(Assignment, rec.assignment)
        except WireError:
            return
        if a.spec is None or a.spec.health is None:
            return
        exec_id = _exec_id(a.task_id, a.attempt)
        files_dir = str(self.executor.files_dir(exec_id))
        env = {**expand_env(dict(a.spec.env), files_dir), **files_env(files_dir)}
        exec_spec = ExecSpec(
            task_id=exec_id,
            argv=a.spec.argv,
            env=tuple(sorted(env.items())),
            cwd=a.spec.workdir,
        )
        self._check_health(rec, exec_spec, a.spec.health)

    async def _stop_orphans(self) -> None:
        """Task processes this agent's store does not know (it was lost): stopped, not
        left to run beside the copy the coordinator starts in their place."""
        known = {_exec_id(r.task_id, r.attempt) for r in await self.store.active()}
        for handle in self.executor.orphans(known):
            log.warning("stopping pid %d: a task run this agent has no record of", handle.pid)
            await self.executor.kill(handle, 1.0, reason="orphan: the agent lost its record")

    async def _finish_later(self, rec: TaskRecord, state: str, message: str) -> None:
        """An outcome found at re-adoption, reported now with its message (the reporter
        loop's resend, if this one does not get through, can only say it is late)."""
        log.warning("%s#%d: %s", rec.task_id, rec.attempt, message)
        await self.runs.ended(rec.task_id, rec.attempt, state)
        await self._finish(rec, state, message=message)

    # ------------------------------------------------------------ logs

    async def _serve_logs(self, msg) -> None:
        if not msg.reply:
            return
        try:
            req = decode(LogsRequest, msg.data)
        except WireError as exc:
            await self.nc.publish(msg.reply, error_reply(ErrorCode.BAD_REQUEST, str(exc)))
            return
        attempt = req.attempt
        if attempt is None:
            rec = await self.store.latest(req.task_id)
            attempt = rec.attempt if rec else None
        if attempt is None:
            await self.nc.publish(
                msg.reply, error_reply(ErrorCode.NOT_FOUND, f"no task {req.task_id!r} on this node")
            )
            return
        data = self.executor.read_log(_exec_id(req.task_id, attempt), req.stream, req.tail_bytes)
        await self.nc.publish(
            msg.reply, ok(task_id=req.task_id, attempt=attempt, stream=req.stream, data=data)
        )


def _exec_id(task_id: str, attempt: int) -> str:
    return f"{task_id}#{attempt}"


def _stored_grant(rec: TaskRecord) -> GpuGrant | None:
    """The GPU grant of a task the agent re-adopts; None (not watched) if unreadable."""
    try:
        spec = decode(Assignment, rec.assignment).spec
        if spec is None:
            return NO_GPU
        return gpu_grant(spec.resources.gpu, spec.resources.gpu_memory, spec.gpu_uuids)
    except (WireError, GpuGrantError):
        return None


def _stored_ports(rec: TaskRecord) -> dict[str, int]:
    try:
        spec = decode(Assignment, rec.assignment).spec
    except WireError:
        return {}
    return dict(spec.ports) if spec is not None else {}


def _outcome(status: ExitStatus) -> tuple[str, str]:
    if status.timed_out:
        return "FAILED", "exceeded its max run time and was killed"
    if status.reason:  # the agent killed it for cause (the GPU watchdog): not a user's kill
        return "FAILED", status.reason
    if status.killed:
        return "KILLED", "killed"
    if status.exit_code == 0:
        return "SUCCEEDED", ""
    if status.exit_code is None and status.signal is None:
        # Only an adopted task whose wrapper wrote no exit file: not a failure we know of.
        return "FAILED", "exit status unknown: the task left no exit file"
    if status.exit_code is None:
        return "FAILED", f"terminated by signal {status.signal}"
    return "FAILED", f"exited with code {status.exit_code}"
