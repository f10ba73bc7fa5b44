"""The ``spark`` framework: a Spark standalone cluster as one gang, and a driver.

A spark job has three groups (workloads/training.py): ``master`` (one), ``worker`` (the
job's ``workers``) and ``driver`` (one; its command is what follows ``spark-submit``:
the application and its arguments, optionally led by spark-submit's own options).
The master and worker commands are Spark's own daemons, run in the foreground with
``spark-class`` so that the task *is* the daemon: Mesh's kill stops it, its exit ends
the task. The driver is the primary task: when it ends, the job ends with its outcome
and Mesh stops the cluster.

Where the scripts come from: ``$SPARK_HOME/bin`` when the group's env sets SPARK_HOME,
else the bare names ``spark-class`` / ``spark-submit``, found on the task's PATH, which
the agent starts with its own interpreter's directory (agent/executor.py): an agent run
from a virtual environment with pyspark installed (the ``train`` extra) finds pyspark's
scripts there, and they find their Spark home and ``java`` themselves.

Why the workers and the driver wait for the master before they start Spark: a worker
that finds no master retries only after 5 to 15 s (Worker.scala's fuzzed 10 s), and the
driver's app client after 20 s (StandaloneAppClient: 3 tries, 20 s apart, fixed in the
4.0.1 jar); measured here, a master one second late delayed a worker's registration to
12.4 s. The gang starts its tasks at about the same moment,
so each worker and the driver first run ``wait_master.py`` (written to their files
directory), which polls the master's port every 0.1 s and then becomes the Spark
command (exec), or fails the task, naming the master, after ``MASTER_WAIT_S``.

Memory: each JVM gets its task's memory less an overhead for what the heap does not
hold (Spark's own rule for executors on YARN and Kubernetes: max(384 MiB, 10%)). A
worker's task holds its daemon (heap ``DAEMON_HEAP``, about twice that resident) and
its executors (heap: what the worker offers, ``--memory``); the driver asks for
executors of exactly that size, since a standalone executor larger than its worker's
offer is never launched. Spark refuses a heap under 450 MiB, so a worker needs at
least ``MIN_WORKER_MEMORY`` and the driver ``MIN_DRIVER_MEMORY``.

Measured (tests/integration/test_spark_adapter.py, 512 MiB heaps): peak resident
memory of a worker task (daemon, executor, Python worker) 453 MiB, the driver's (JVM and
Python) 381 MiB, the master's 156 MiB; so the master needs about 256 MiB at least.

``JAVA_TOOL_OPTIONS`` shrinks what each JVM reserves (not what it uses): an agent that
limits memory with ``ulimit -v`` (its rlimit mode, without cgroups) caps address space,
and a default JVM reserves over 2 GiB of it even with a 128 MiB heap (measured: ``java
-Xmx128m -version`` fails under 2 GiB, runs under 640 MiB with these flags and
MALLOC_ARENA_MAX=2; a 512 MiB heap needs 1 GiB; the whole cluster ran with 1.25 GiB per
process, and a master under 512 MiB failed to reserve its metaspace). Under cgroups
(resident memory) the sizes above suffice. A group's env may set its own options.
"""

from __future__ import annotations

from workloads.frameworks import FILES_PREFIX, Launch, Peer, TaskContext, common_env
from workloads.spark_memory import (
    DAEMON_FOOTPRINT,
    DAEMON_HEAP,
    MIN_DRIVER_MEMORY,
    MIN_OVERHEAD,
    MIN_WORKER_MEMORY,
    MiB,
)
from workloads.spec import JobSpec, TaskGroup

__all__ = [
    "DAEMON_HEAP",
    "MASTER_WAIT_S",
    "MIN_DRIVER_MEMORY",
    "MIN_WORKER_MEMORY",
    "PORTS",
    "PRIMARY",
    "RENDEZVOUS",
    "executor_memory",
    "ports_for",
    "primary",
    "rendezvous",
    "spark",
]

MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
# The named ports each role is given, besides its group's own: the daemons' RPC port
# (``spark``: the master's is the cluster's URL) and web UI; the driver's RPC and block
# manager ports, which its executors connect back to, and its UI.
PORTS = {
    "master": ("spark", "webui"),
    "worker": ("spark", "webui"),
    "driver": ("driver", "blockmanager", "webui"),
}
RENDEZVOUS = ("master", 0)  # placed first, preempted last: everything meets here
PRIMARY = ("driver", 0)  # its end is the job's end
MASTER_WAIT_S = 120  # how long a worker or the driver waits for the master's port
JAVA_TOOL_OPTIONS = (
    "-XX:CompressedClassSpaceSize=64m -XX:ReservedCodeCacheSize=64m "
    "-XX:MaxMetaspaceSize=192m -Xss512k"
)
WAIT_SCRIPT = "wait_master.py"
_WAIT_MASTER = '''\
"""Wait until the Spark master accepts connections, then become the given command."""
import os, socket, sys, time

host, port, limit = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
deadline = time.monotonic() + limit
while True:
    try:
        socket.create_connection((host, port), timeout=1.0).close()
        break
    except OSError as exc:
        if time.monotonic() >= deadline:
            sys.exit(
                f"mesh: the Spark master at {host}:{port} accepted no connection "
                f"within {limit:g} s ({exc})"
            )
        time.sleep(0.1)
os.execvp(sys.argv[4], sys.argv[4:])
'''


def ports_for(spec: JobSpec, group: TaskGroup, index: int) -> tuple[str, ...]:
    """The ports a task's Spark role needs besides its group's own."""
    return PORTS.get(group.role, ())


def rendezvous(spec: JobSpec) -> tuple[str, int]:
    return RENDEZVOUS


def primary(spec: JobSpec) -> tuple[str, int]:
    return PRIMARY


def spark(spec: JobSpec, group: TaskGroup, ctx: TaskContext) -> Launch:
    """The task's daemon (master, worker) or its ``spark-submit`` (driver)."""
    me = ctx.me
    master_host, master_port = _master(ctx)
    url = f"spark://{master_host}:{master_port}"
    env = dict(group.env)
    env.setdefault("JAVA_TOOL_OPTIONS", JAVA_TOOL_OPTIONS)
    env.setdefault("MALLOC_ARENA_MAX", "2")  # glibc's 64 MiB arena per thread, also reserved
    env.update(common_env(ctx))
    env["SPARK_LOCAL_IP"] = me.host  # what it binds to and tells its peers
    env["SPARK_MASTER_URL"] = url
    files: tuple[tuple[str, str], ...] = ()
    if group.role == "master":
        env["SPARK_DAEMON_MEMORY"] = _mib(max(DAEMON_HEAP, _heap(group.resources.memory)))
        argv = (
            _script(group, "spark-class"),
            MASTER_CLASS,
            "--host",
            me.host,
            "--port",
            str(_port(me, "spark")),
            "--webui-port",
            str(_port(me, "webui")),
        )
    elif group.role == "worker":
        env["SPARK_DAEMON_MEMORY"] = _mib(DAEMON_HEAP)
        env["SPARK_WORKER_DIR"] = FILES_PREFIX + "work"  # executors' dirs and logs
        env["SPARK_LOCAL_DIRS"] = FILES_PREFIX + "local"  # shuffle and spill
        argv = (
            *_wait(master_host, master_port),
            _script(group, "spark-class"),
            WORKER_CLASS,
            url,
            "--host",
            me.host,
            "--port",
            str(_port(me, "spark")),
            "--webui-port",
            str(_port(me, "webui")),
            "--cores",
            str(_cores(group)),
            "--memory",
            _mib(_worker_offer(group)),
        )
        files = ((WAIT_SCRIPT, _WAIT_MASTER),)
    elif group.role == "driver":
        env["SPARK_LOCAL_DIRS"] = FILES_PREFIX + "local"
        argv = (
            *_wait(master_host, master_port),
            _script(group, "spark-submit"),
            "--master",
            url,
            "--driver-memory",
            _mib(_heap(group.resources.memory)),
            "--executor-memory",
            _mib(executor_memory(spec)),
            *_conf("spark.driver.host", me.host),
            *_conf("spark.driver.port", _port(me, "driver")),
            *_conf("spark.driver.blockManager.port", _port(me, "blockmanager")),
            *_conf("spark.ui.port", _port(me, "webui")),
            # Use the whole cluster the gang was given: the first stage waits (Spark's
            # bound: 30 s) for every worker's cores rather than start on the first one.
            *_conf("spark.cores.max", sum(_cores(g) * g.count for g in _workers(spec))),
            *_conf("spark.scheduler.minRegisteredResourcesRatio", "1.0"),
            # A taken port fails the submit instead of Spark quietly trying the next one,
            # which its executors (told the planned one) would not find.
            *_conf("spark.port.maxRetries", 0),
            *group.command,
        )
        files = ((WAIT_SCRIPT, _WAIT_MASTER),)
    else:
        raise ValueError(f"spark: no such role {group.role!r} (master, worker, driver)")
    return Launch(argv, tuple(sorted(env.items())), files)


def executor_memory(spec: JobSpec) -> int:
    """Bytes of heap each executor gets: what the smallest worker offers."""
    return min(_worker_offer(g) for g in _workers(spec))


def _workers(spec: JobSpec) -> tuple[TaskGroup, ...]:
    groups = tuple(g for g in spec.tasks if g.role == "worker")
    if not groups:
        raise ValueError(f"spark: job {spec.name!r} has no worker group")
    return groups


def _cores(group: TaskGroup) -> int:
    """Whole cores a worker offers: its cpu rounded down, at least one."""
    return max(1, group.resources.cpu // 1000)


def _worker_offer(group: TaskGroup) -> int:
    """What a worker offers its executors: its memory less its daemon and their overhead."""
    return _heap(group.resources.memory - DAEMON_FOOTPRINT)


def _heap(memory: int) -> int:
    """A JVM's heap in a task of ``memory`` bytes, in whole MiB (at least 1 MiB: a
    smaller task is refused by Spark with its own message, not by us at run time)."""
    heap = memory - max(MIN_OVERHEAD, memory // 10)
    return max(MiB, heap // MiB * MiB)


def _mib(n: int) -> str:
    return f"{n // MiB}m"


def _master(ctx: TaskContext) -> tuple[str, int]:
    masters = ctx.of_role("master")
    if not masters:
        raise ValueError(f"spark: job {ctx.job_id} has no placed master")
    return masters[0].host, _port(masters[0], "spark")


def _port(peer: Peer, name: str) -> int:
    port = peer.port(name)
    if port is None:
        raise ValueError(f"spark: {peer.role}[{peer.index}] was given no {name!r} port")
    return port


def _wait(host: str, port: int) -> tuple[str, ...]:
    return ("python3", FILES_PREFIX + WAIT_SCRIPT, host, str(port), str(MASTER_WAIT_S))


def _conf(key: str, value: object) -> tuple[str, str]:
    return ("--conf", f"{key}={value}")


def _script(group: TaskGroup, name: str) -> str:
    home = dict(group.env).get("SPARK_HOME")
    return f"{home.rstrip('/')}/bin/{name}" if home else name
