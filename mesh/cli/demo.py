"""`mesh demo` (and `make demo`): a throwaway region, a few real jobs, a summary.

It starts everything `mesh up` starts (NATS, two coordinator candidates, this machine's
agent, a few simulated nodes) in a temporary directory, submits a single-task job, a
multi-task job, a simulated gang and one job that fails on purpose, waits for them,
prints what happened, and stops it all. Exit 0 only if every job ended as expected.
Like `mesh up`, it runs secure: TLS, a certificate per component, per-identity
permissions and signed assignments (docs/security.md).
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import time
from pathlib import Path

from mesh.cli import render
from mesh.cli.launcher import LocalMesh, LocalMeshConfig
from mesh.client import MeshClient
from mesh.connect import close_quietly, connect

JOBS: list[tuple[str, str, str]] = [
    (
        "SUCCEEDED",
        "single-task batch job",
        """
name: hello
tasks:
  - role: main
    command: echo "hello from $(hostname)"; python3 -c 'print(sum(range(10**6)))'
    resources: {cpu: 250m, memory: 128Mi}
""",
    ),
    (
        "SUCCEEDED",
        "multi-task job (3 workers)",
        """
name: workers
tasks:
  - role: worker
    count: 3
    command: echo "worker $MESH_TASK_ID starting"; sleep 0.5; echo done
    resources: {cpu: 100m, memory: 64Mi}
""",
    ),
    (
        "SUCCEEDED",
        "simulated gang of 8 on hollow nodes",
        """
name: sim-train
tasks:
  - role: trainer
    count: 8
    simulate: {duration: 1s}
    resources: {cpu: 4, memory: 16Gi}
""",
    ),
    (
        "FAILED",
        "job that fails on purpose (exit 3)",
        """
name: fails-on-purpose
tasks:
  - role: main
    command: echo "about to fail" >&2; exit 3
""",
    ),
]


async def _run(mesh: LocalMesh) -> bool:
    t0 = time.monotonic()
    info = await mesh.wait_ready()
    print(
        f"region up in {time.monotonic() - t0:.1f}s: NATS {mesh.url} "
        f"({'TLS, client certificates, signed assignments' if mesh.certs_dir else 'insecure'}), "
        f"leader {info['leader']} "
        f"(term {info['term']}), {info['nodes'].get('ready', 0)} nodes ready\n"
    )
    nc = await connect(mesh.url, name="mesh-demo", **mesh.client_options())
    client = MeshClient(nc, mesh.config.region)
    try:
        print(render.nodes_table(await client.nodes()) + "\n")
        ids = []
        for expected, what, spec in JOBS:
            job_id = await client.submit(spec)
            ids.append((job_id, expected, what))
            print(f"submitted {job_id:28} {what}")
        print()
        results = [await client.wait(job_id, timeout=30.0) for job_id, _, _ in ids]
        print(render.jobs_table(results) + "\n")
        good = True
        for job, (_, expected, what) in zip(results, ids, strict=True):
            tasks = job["task_list"]
            codes = sorted({t["exit_code"] for t in tasks}, key=str)
            mark = "ok " if job["state"] == expected else "BAD"
            good &= job["state"] == expected
            print(
                f"[{mark}] {what}: {job['state']} (expected {expected}), exit codes {codes}, "
                f"took {render.duration(job['submitted_at'], job['finished_at'])}"
            )
            if job["state"] == "FAILED":
                for t in tasks:
                    if t["log_tail"]:
                        print(f"      {t['task_id']} stderr: {t['log_tail'].strip()}")
        hello = await client.logs(ids[0][0])
        print(f"\n`mesh job logs {ids[0][0]}` (from node {hello['node_id']}):")
        print("      " + hello["data"].decode(errors="replace").strip().replace("\n", "\n      "))
        return good
    finally:
        await close_quietly(nc)


def run_demo(sim_nodes: int = 4) -> int:
    with tempfile.TemporaryDirectory(prefix="mesh-demo-") as tmp:
        mesh = LocalMesh(LocalMeshConfig(state_dir=Path(tmp), sim_nodes=sim_nodes, port=0))
        t0 = time.monotonic()
        try:
            mesh.start()
            good = asyncio.run(_run(mesh))
        finally:
            mesh.stop()
        print(
            f"\ndemo {'passed' if good else 'FAILED'} in {time.monotonic() - t0:.1f}s; "
            "everything stopped",
            file=sys.stderr,
        )
        return 0 if good else 1
