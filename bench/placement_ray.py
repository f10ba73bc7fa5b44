"""Ray side of the gang placement comparison.

`ray_gangs()` places the same gang shapes Mesh places, as Ray placement groups
on a local multi-raylet cluster, and reports gangs/s. Ray runs in a child
process so its threads, signal handlers, logging and ~2 s import never reach
the caller, and so a placement that never becomes ready (infeasible gangs wait
forever in Ray) costs a kill rather than a hung bench.

Run `python -m bench.placement_ray --selftest` for a small sample, or
`python -m bench placement_ray [--nodes N ...]` through the bench runner.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

LOOPBACK = "127.0.0.1"
RESULT_KEYS = (
    "ray_version",
    "nodes",
    "cpus_per_node",
    "gangs",
    "tasks",
    "mode",
    "strategy",
    "seconds",
    "gangs_per_s",
    "tasks_per_s",
    "startup_s",
    "ray_topology",
)
# Seconds the child keeps for itself after its own deadline, so it can tear the
# cluster down and report before the parent's kill.
TEARDOWN_MARGIN_S = 20.0
# Placement never needs a worker process (ready() is a GCS call), so keep the
# raylets from forking num_cpus idle Python workers on a 2-core machine.
SYSTEM_CONFIG = {"prestart_worker_first_driver": False, "enable_worker_prestart": False}


# --------------------------------------------------------------------------- parent


def ray_gangs(
    nodes: int,
    cpus_per_node: int,
    gangs: list[list[int]],
    strategy: str = "PACK",
    mode: str = "sequential",
    timeout_s: float = 300,
) -> dict:
    """Place `gangs` (lists of bundle CPU sizes) as Ray placement groups.

    Returns the RESULT_KEYS dict; on any failure the same keys (unmeasured ones
    None) plus "error" and "stderr_tail", so a caller can tabulate either.
    """
    if mode not in ("sequential", "batch"):
        raise ValueError(f"mode must be 'sequential' or 'batch', not {mode!r}")
    args = {
        "nodes": nodes,
        "cpus_per_node": cpus_per_node,
        "gangs": gangs,
        "strategy": strategy,
        "mode": mode,
        "timeout_s": timeout_s,
    }
    reason = _infeasible(args)
    if reason:
        return _error(args, f"not placed, would wait forever in Ray: {reason}")
    # A private temp dir keeps this run's sockets, logs and "current cluster"
    # file away from any other Ray on the machine, and is easy to remove.
    root = tempfile.mkdtemp(prefix="mray", dir="/tmp")
    try:
        ray_dir = os.path.join(root, "ray")  # Ray's own layout under RAY_TMPDIR
        os.mkdir(ray_dir)
        return _run_child({**args, "temp_dir": ray_dir}, timeout_s)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _infeasible(args: dict) -> str | None:
    """Catch shapes Ray would queue forever, before paying for a cluster."""
    cap, per_node = args["nodes"] * args["cpus_per_node"], args["cpus_per_node"]
    need = sum(sum(g) for g in args["gangs"])
    if need > cap:
        return f"{need} CPUs asked of {cap}"
    for i, gang in enumerate(args["gangs"]):
        if max(gang, default=0) > per_node:
            return f"gang {i} has a bundle larger than a node"
        if args["strategy"] == "STRICT_PACK" and sum(gang) > per_node:
            return f"gang {i} cannot STRICT_PACK onto one node"
        if args["strategy"] == "STRICT_SPREAD" and len(gang) > args["nodes"]:
            return f"gang {i} has more bundles than nodes for STRICT_SPREAD"
    return None


def _run_child(args: dict, timeout_s: float) -> dict:
    """Run the worker in its own session so the whole tree can be killed."""
    cmd = [sys.executable, "-m", "bench.placement_ray", "--worker", json.dumps(args)]
    env = {**os.environ, **_ray_env(os.path.dirname(args["temp_dir"]))}
    proc = subprocess.Popen(
        cmd,
        cwd=Path(__file__).resolve().parents[1],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        _kill_tree(proc.pid)
        out, err = proc.communicate()
        return _error(args, f"timed out after {timeout_s:g} s; killed", err)
    finally:
        _kill_tree(proc.pid)  # raylets that outlived a crashed child
    result = _last_json(out)
    if result is None:
        return _error(args, f"worker exited {proc.returncode} without a result", err)
    if "error" in result:
        result["stderr_tail"] = _tail(err)
    return result


def _ray_env(tmp_root: str) -> dict[str, str]:
    """Environment that keeps every Ray address on loopback, files in tmp_root.

    Ray rewrites 127.0.0.1 in a bootstrap address to the machine's outward IP
    (ray._private.services.resolve_ip_for_localhost) unless this switch, meant
    for single-machine clusters, is off; the GCS listens on loopback only, so
    without it the driver never connects. RAY_TMPDIR moves the files Ray keeps
    outside the session (the "current cluster" address) out of /tmp/ray.
    """
    return {
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
        "RAY_TMPDIR": tmp_root,
        "RAY_USAGE_STATS_ENABLED": "0",
        "RAY_DEDUP_LOGS": "0",
        "PYTHONUNBUFFERED": "1",
    }


def _kill_tree(pid: int) -> None:
    """SIGKILL the child's process group and anything it forked elsewhere."""
    victims = _descendants(pid)
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    for child in victims:
        try:
            os.kill(child, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _descendants(pid: int) -> list[int]:
    """Walk /proc, since Ray's helpers may leave the child's process group."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    found, frontier = [], [pid]
    while frontier:
        parent = frontier.pop()
        kids = [p for p, pp in parents.items() if pp == parent]
        found.extend(kids)
        frontier.extend(kids)
    return found


def _last_json(text: str) -> dict | None:
    """The result is the last JSON object line; anything above is noise."""
    for line in reversed(text.splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                continue
    return None


def _tail(text: str, chars: int = 2000) -> str:
    return text[-chars:] if text else ""


def _error(args: dict, message: str, stderr: str = "") -> dict:
    """Same shape as a success, so tables do not need a second code path."""
    result: dict[str, Any] = dict.fromkeys(RESULT_KEYS)
    result.update(_shape(args))
    result["error"] = message
    result["stderr_tail"] = _tail(stderr)
    return result


def _shape(args: dict) -> dict:
    gangs = args["gangs"]
    return {
        "nodes": args["nodes"],
        "cpus_per_node": args["cpus_per_node"],
        "gangs": len(gangs),
        "tasks": sum(len(g) for g in gangs),
        "mode": args["mode"],
        "strategy": args["strategy"],
    }


# --------------------------------------------------------------------------- child


def _worker(args: dict) -> dict:
    """Start the cluster, place the gangs, tear down; runs in the child only."""
    import ray

    deadline = time.monotonic() + max(1.0, args["timeout_s"] - TEARDOWN_MARGIN_S)
    result: dict[str, Any] = dict.fromkeys(RESULT_KEYS)
    result.update(_shape(args), ray_version=ray.__version__)
    cluster = None
    try:
        t0 = time.perf_counter()
        cluster, topology, why = _start(args, deadline)
        result["startup_s"] = round(time.perf_counter() - t0, 3)
        result["ray_topology"] = topology
        if why:
            result["fallback_reason"] = why
        result.update(_place(args, deadline))
    except Exception as exc:  # noqa: BLE001 - reported to the parent, not raised
        result["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        _stop(cluster)
    return result


def _start(args: dict, deadline: float) -> tuple[Any, str, str | None]:
    """Multi-raylet cluster; one big raylet only if that cannot come up."""
    try:
        return _start_cluster(args, deadline), "multi-raylet", None
    except Exception as exc:  # noqa: BLE001 - fall back, but say why
        why = f"{type(exc).__name__}: {exc}"
        print(f"multi-raylet cluster failed ({why}); single raylet", file=sys.stderr)
    _start_single(args)
    return None, "single-raylet", why


def _start_cluster(args: dict, deadline: float) -> Any:
    """`nodes` raylets (head included) on loopback, then connect the driver."""
    import ray
    from ray.cluster_utils import Cluster

    common = {
        "num_cpus": args["cpus_per_node"],
        "node_ip_address": LOOPBACK,
        "temp_dir": args["temp_dir"],
    }
    cluster = Cluster(
        initialize_head=True,
        head_node_args={**common, "include_dashboard": False, "_system_config": SYSTEM_CONFIG},
    )
    try:
        for _ in range(args["nodes"] - 1):
            cluster.add_node(**common)
            _check_deadline(deadline, "starting raylets")
        cluster.wait_for_nodes(timeout=max(1.0, deadline - time.monotonic()))
        ray.init(
            address=cluster.address,
            _node_ip_address=LOOPBACK,
            _temp_dir=args["temp_dir"],
            include_dashboard=False,
            logging_level="WARNING",
        )
        _check_alive(args)
    except BaseException:
        _stop(cluster)
        raise
    return cluster


def _start_single(args: dict) -> None:
    """The same CPUs on one raylet: placement still runs, spread is not real."""
    import ray

    ray.init(
        address="local",
        _node_ip_address=LOOPBACK,
        _temp_dir=args["temp_dir"],
        include_dashboard=False,
        num_cpus=args["nodes"] * args["cpus_per_node"],
        logging_level="WARNING",
        _system_config=SYSTEM_CONFIG,
    )


def _check_alive(args: dict) -> None:
    """wait_for_nodes() counts GCS entries; confirm the driver sees them too."""
    import ray

    alive = [n for n in ray.nodes() if n["Alive"]]
    cpus = ray.cluster_resources().get("CPU", 0)
    want = args["nodes"] * args["cpus_per_node"]
    if len(alive) != args["nodes"] or cpus != want:
        raise RuntimeError(f"driver sees {len(alive)} nodes / {cpus} CPU, want {want}")


def _check_deadline(deadline: float, doing: str) -> None:
    if time.monotonic() > deadline:
        raise TimeoutError(f"deadline passed while {doing}")


def _place(args: dict, deadline: float) -> dict:
    """Time only create+ready; removal happens after the clock stops."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    shapes = [[{"CPU": float(c)} for c in gang] for gang in args["gangs"]]
    pgs: list[Any] = []
    t0 = time.perf_counter()
    try:
        if args["mode"] == "sequential":
            for bundles in shapes:
                pg = placement_group(bundles, strategy=args["strategy"])
                pgs.append(pg)
                ray.get(pg.ready(), timeout=_left(deadline))
        else:
            pgs = [placement_group(b, strategy=args["strategy"]) for b in shapes]
            ray.get([pg.ready() for pg in pgs], timeout=_left(deadline))
        seconds = time.perf_counter() - t0
        used = _nodes_used(pgs)
    except ray.exceptions.GetTimeoutError as exc:
        raise TimeoutError(f"{len(pgs)} of {len(shapes)} gangs created, not all ready") from exc
    finally:
        for pg in pgs:
            remove_placement_group(pg)
    return {**_rates(args, seconds), "nodes_used": used}


def _nodes_used(pgs: list[Any]) -> int:
    """Distinct raylets holding bundles: shows PACK vs SPREAD really differ."""
    from ray.util import placement_group_table

    nodes: set[str] = set()
    for pg in pgs:
        nodes.update(placement_group_table(pg).get("bundles_to_node_id", {}).values())
    return len(nodes)


def _left(deadline: float) -> float:
    return max(0.1, deadline - time.monotonic())


def _rates(args: dict, seconds: float) -> dict:
    shape = _shape(args)
    return {
        "seconds": round(seconds, 4),
        "gangs_per_s": round(shape["gangs"] / seconds, 2) if seconds else None,
        "tasks_per_s": round(shape["tasks"] / seconds, 2) if seconds else None,
    }


def _stop(cluster: Any) -> None:
    """Best effort: the parent kills whatever this leaves behind."""
    import ray

    try:
        ray.shutdown()
    except Exception:  # noqa: BLE001
        pass
    if cluster is not None:
        try:
            cluster.shutdown()
        except Exception:  # noqa: BLE001
            pass


def _worker_main(raw: str) -> int:
    """Ray prints to stdout too; keep fd 1 for the one result line only."""
    result_out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    result = _worker(json.loads(raw))
    result_out.write(json.dumps(result, sort_keys=True) + "\n")
    result_out.flush()
    return 0 if "error" not in result else 1


# --------------------------------------------------------------------------- CLI


def selftest_gangs(count: int = 20, seed: int = 7) -> list[list[int]]:
    """20 gangs of 2-8 one-CPU bundles: fits 8 nodes x 16 CPUs with room."""
    import random

    rng = random.Random(seed)
    return [[1] * rng.randint(2, 8) for _ in range(count)]


def main(argv: list[str]) -> dict:
    """Entry for `python -m bench placement_ray`; defaults are the selftest."""
    p = argparse.ArgumentParser(prog="bench.placement_ray")
    p.add_argument("--nodes", type=int, default=8)
    p.add_argument("--cpus-per-node", type=int, default=16)
    p.add_argument("--gangs", type=int, default=20)
    p.add_argument("--strategy", default="PACK")
    p.add_argument("--mode", default="sequential", choices=("sequential", "batch"))
    p.add_argument("--timeout", type=float, default=300)
    p.add_argument(
        "--quick",
        action="store_true",
        help="4 gangs on 2 nodes of 4 CPUs; where Ray is not installed, says so and runs nothing",
    )
    a = p.parse_args(argv)
    if a.quick:
        if not ray_installed():
            return {"not_run": RAY_MISSING, "targets": {}}
        a.nodes, a.cpus_per_node, a.gangs, a.timeout = 2, 4, 4, 120
    result = ray_gangs(
        a.nodes, a.cpus_per_node, selftest_gangs(a.gangs), a.strategy, a.mode, a.timeout
    )
    return {**result, "targets": {"all_gangs_placed": "error" not in result}}


RAY_MISSING = "ray is not installed: it comes with the `bench` extra (make bench)"


def ray_installed() -> bool:
    """Whether Ray can be imported here (the `bench` extra), without importing it."""
    return importlib.util.find_spec("ray") is not None


def _cli(argv: list[str]) -> int:
    if argv[:1] == ["--worker"]:
        return _worker_main(argv[1])
    if argv[:1] == ["--selftest"]:
        argv = argv[1:]
    result = main(argv)
    print(json.dumps(result, sort_keys=True), flush=True)
    return 0 if "error" not in result else 1


if __name__ == "__main__":
    sys.exit(_cli(sys.argv[1:]))
