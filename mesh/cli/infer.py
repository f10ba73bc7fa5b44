"""`mesh model` and `mesh infer`: serve inference models as jobs, and use them.

- `mesh model deploy FILE` reads a model spec (`workloads.model`), turns it into its
  ordinary job of worker replicas and submits it: the coordinator places the replicas
  like any task, the agents run them, and they announce themselves to the router.
- `mesh model list` shows the jobs that serve models.
- `mesh infer request` sends one request; `mesh infer load` runs the load generator
  (`inference.loadgen`) with this context's identity and prints goodput, p50/p99 and the
  bad rate.

`mesh up --inference-workers N` uses `deploy_local_pool` to serve the numpy model on the
machine's own agent (see docs/inference_deploy.md).
"""

from __future__ import annotations

import argparse
import asyncio
import time
import uuid
from typing import Any

from mesh.client import FINISHED, MeshClient
from mesh.connect import ClientTls
from mesh.schema import ApiError, ErrorCode
from workloads.model import MODEL_LABEL, WORKER_ROLE, ModelSpec, model_job, parse_model_spec

DEFAULT_MODEL = "mlp"  # the numpy MLP of inference.worker
MLP_IN_DIM = 32  # its input: 32 float32
NODE_LABEL = "mesh.node"  # `mesh up` labels its agent with its node id, to pin work there


# ---------------------------------------------------------------- parsers


def add_parsers(sub: Any) -> None:
    model = sub.add_parser("model", help="inference models served as jobs").add_subparsers(
        dest="model_cmd", required=True
    )
    dep = model.add_parser("deploy", help="serve a model spec (YAML): submit its worker job")
    dep.add_argument("file", help="model spec file, or - for stdin")
    dep.add_argument("--client-id", help="idempotency key (default: random)")
    ls = model.add_parser("list", help="jobs serving models, with their running replicas")
    ls.add_argument("--all", action="store_true", help="finished jobs too")
    ls.add_argument("--limit", type=int, default=200, help="jobs to look at")

    infer = sub.add_parser("infer", help="send inference requests").add_subparsers(
        dest="infer_cmd", required=True
    )
    rq = infer.add_parser("request", help="one request; prints the output or the error")
    rq.add_argument("--model", default=DEFAULT_MODEL)
    rq.add_argument("--deadline-ms", type=float, default=1000.0)
    rq.add_argument(
        "--input",
        help=f"comma-separated floats (default: {MLP_IN_DIM} zeros, the MLP's input)",
    )
    ld = infer.add_parser(
        "load", help="open-loop Poisson load with deadlines: goodput, p50/p99, bad rate"
    )
    ld.add_argument("--model", default=DEFAULT_MODEL)
    ld.add_argument("--rate", type=float, default=500.0, help="requests per second")
    ld.add_argument("--duration", type=float, default=5.0, help="seconds of arrivals")
    ld.add_argument("--deadline-ms", type=float, default=100.0)
    ld.add_argument("--concurrency", type=int, default=0, help="closed loop instead, N in flight")
    ld.add_argument("--in-dim", type=int, default=MLP_IN_DIM)
    ld.add_argument("--seed", type=int, default=1)


def check_args(args: argparse.Namespace) -> str | None:
    """A message for a bad value, found before connecting; None if all is well."""
    if args.cmd == "infer":
        if not args.deadline_ms > 0:
            return f"--deadline-ms must be more than 0, got {args.deadline_ms}"
        if args.infer_cmd == "load":
            if args.concurrency < 0 or (args.concurrency == 0 and not args.rate > 0):
                return "--rate must be more than 0 (or give --concurrency N)"
            if not args.duration > 0:
                return f"--duration must be more than 0, got {args.duration}"
            if args.in_dim < 1:
                return f"--in-dim must be at least 1, got {args.in_dim}"
        elif args.input is not None:
            try:
                values = [float(x) for x in args.input.split(",")]
            except ValueError:
                return f"--input: expected comma-separated numbers, got {args.input[:80]!r}"
            args.values = values
    if args.cmd == "model" and args.model_cmd == "list" and args.limit < 1:
        return f"--limit must be at least 1, got {args.limit}"
    return None


# ---------------------------------------------------------------- models


async def deploy(client: MeshClient, spec: ModelSpec, client_id: str | None = None) -> str:
    """Submit the model's job; returns its id."""
    return await client.submit(model_job(spec).to_dict(), client_id=client_id)


async def model_jobs(client: MeshClient, *, active_only: bool = True, limit: int = 200) -> list:
    """(model name, job detail) of the jobs that serve models, newest first."""
    out = []
    for summary in await client.jobs(limit=limit):
        if active_only and summary["state"] in FINISHED:
            continue
        try:
            job = await client.job(summary["job_id"])
        except ApiError as exc:
            if exc.code == ErrorCode.NOT_FOUND:
                continue
            raise
        name = (job.get("spec") or {}).get("labels", {}).get(MODEL_LABEL)
        if name is not None:
            out.append((name, job))
    return out


def models_table(rows: list) -> str:
    from mesh.cli.render import table

    lines = []
    for name, job in rows:
        tasks = [t for t in job["task_list"] if t["role"] == WORKER_ROLE]
        running = sum(t["state"] == "RUNNING" for t in tasks)
        nodes = sorted({t["node_id"] for t in tasks if t["node_id"]})
        lines.append(
            [name, job["job_id"], job["state"], f"{running}/{len(tasks)}", ",".join(nodes) or "-"]
        )
    return table(lines, ["MODEL", "JOB", "STATE", "RUNNING", "NODES"]) if lines else "no models"


# ---------------------------------------------------------------- requests


async def request_once(
    nc, region: str, model: str, values: list[float], deadline_ms: float, timeout: float
) -> dict:
    """One inference request: the decoded reply ({ok, output, worker} or {ok: false, error})."""
    from inference.wire import InferReply, decode, encode, infer_subject

    body = {
        "values": tuple(values),
        "deadline_unix_ns": time.time_ns() + int(deadline_ms * 1e6),
        "v": 1,
    }
    msg = await nc.request(infer_subject(region, model), encode(body), timeout=timeout)
    rep = decode(InferReply, msg.data)
    if rep.ok:
        import numpy as np

        return {
            "ok": True,
            "output": np.frombuffer(rep.output, "<f4").tolist(),
            "worker": rep.worker,
        }
    err = rep.error
    return {
        "ok": False,
        "error": {"code": err.code if err else "?", "message": err.message if err else ""},
    }


async def run_load(args: argparse.Namespace, url: str, region: str, tls: ClientTls | None) -> dict:
    """The load generator in this process, as the CLI's user (its inbox prefix is the
    only one that user may receive replies on)."""
    from inference.loadgen import LoadConfig, LoadGen

    cfg = LoadConfig(
        url=url,
        region=region,
        tls=tls,
        inbox_prefix=tls.inbox_prefix if tls is not None else "_INBOX",
        model=args.model,
        rate=args.rate,
        concurrency=args.concurrency,
        duration_s=args.duration,
        deadline_ms=args.deadline_ms,
        in_dim=args.in_dim,
        seed=args.seed,
    )
    return await LoadGen(cfg).run()


def load_line(r: dict) -> str:
    def ms(v: float | None) -> str:
        return "-" if v is None else f"{v:.1f} ms"

    mode = (
        f"closed loop, {r['concurrency']} in flight"
        if r.get("concurrency")
        else f"offered {r['offered_rate']:g}/s"
    )
    codes = ", ".join(f"{k} {v}" for k, v in sorted(r.get("codes", {}).items())) or "none"
    return (
        f"{mode}, deadline {r['deadline_ms']:g} ms, {r['duration_s']:.1f} s: "
        f"sent {r['sent']} ({r['achieved_rate']:g}/s)\n"
        f"goodput {r['goodput']:g}/s  p50 {ms(r['p50_ms'])}  p99 {ms(r['p99_ms'])}  "
        f"bad rate {r['bad_rate']:.4f}\n"
        f"good {r['good']}, late {r['late']}, dropped {r['dropped']}, errors {r['errors']}, "
        f"lost {r['lost']}; error codes: {codes}"
    )


# ---------------------------------------------------------------- `mesh up`


def local_pool_spec(replicas: int, node_id: str, model: str = DEFAULT_MODEL) -> ModelSpec:
    """The numpy MLP on `mesh up`'s own agent: `replicas` CPU workers of half a core."""
    return parse_model_spec(
        {
            "name": model,
            "runtime": "numpy",
            "memory": "64Mi",
            "slo_ms": 100,
            "max_batch": 128,
            "replicas": replicas,
            "resources": {"cpu": "500m"},
            "placement": {"labels": {NODE_LABEL: node_id}},
            "max_retries": 3,
        }
    )


async def deploy_local_pool(
    client: MeshClient,
    nc,
    spec: ModelSpec,
    *,
    timeout: float = 60.0,
    check=lambda: None,
) -> str:
    """Serve `spec` and wait until it serves: every replica RUNNING (placed by the
    coordinator, run by the agent) and a request answered with an output. A job still
    serving the same model (an earlier `mesh up` on this state dir) is killed first, so
    its replicas do not join the new ones. `check` is called while waiting (the launcher
    raises there if a child process died). Returns the job id."""
    for _, job in await model_jobs(client):
        if job["spec"]["labels"].get(MODEL_LABEL) == spec.name:
            await client.kill(job["job_id"], "replaced by a new `mesh up` inference pool")
    job_id = await deploy(client, spec, client_id=f"mesh-up-{uuid.uuid4().hex}")
    deadline = time.monotonic() + timeout
    running = 0
    last: Any = None
    while True:
        check()
        job = await client.job(job_id)
        if job["state"] in FINISHED:
            tails = [t["message"] or t["log_tail"] for t in job["task_list"]]
            raise RuntimeError(f"inference job {job_id} ended {job['state']}: {tails[:1]}")
        running = sum(t["state"] == "RUNNING" for t in job["task_list"])
        if running == spec.replicas:
            try:
                last = await request_once(nc, client.region, spec.name, [0.0] * MLP_IN_DIM, 2000, 3)
                if last["ok"]:
                    return job_id
            except Exception as exc:  # not served yet: no router, or it knows no worker
                last = exc
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"inference pool not serving after {timeout}s: {running}/{spec.replicas} "
                f"replicas running, last request: {last}"
            )
        await asyncio.sleep(0.2)
