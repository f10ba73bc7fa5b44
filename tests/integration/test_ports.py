"""Ports, peers and the primary task end to end: a real nats-server, an in-process
coordinator and agent running real processes.

The framework descriptors belong to workloads.frameworks (the spec helper's): the test
makes task 0 of its job the primary task, and gives each task a named port, by patching
`primary_task` and `ports_for` for the job's name; the job itself runs as `batch`. Its
agent is made to advertise an address and a port range (agents do from issue 22 on), so
the test holds on this branch whatever the agent's defaults are.
"""

from __future__ import annotations

import dataclasses

import pytest

from agent.service import Agent
from workloads import frameworks

from .conftest import eventually

RANGE = (24000, 24099)


@pytest.fixture
def training_patches(monkeypatch):
    node_state = Agent.node_state

    def advertised(self, sample):
        return dataclasses.replace(node_state(self, sample), address="127.0.0.1", port_range=RANGE)

    monkeypatch.setattr(Agent, "node_state", advertised)
    monkeypatch.setattr(
        frameworks, "primary_task", lambda spec: ("w", 0) if spec.name == "prim" else None
    )
    ports_for = frameworks.ports_for
    monkeypatch.setattr(
        frameworks,
        "ports_for",
        lambda spec, group, index: (
            ("rdzv",) if spec.name == "prim" else ports_for(spec, group, index)
        ),
    )


async def test_a_job_ends_with_its_primary_task_and_peers_know_each_other(
    region, tmp_path, training_patches
):
    await region.coordinator()
    await region.agent()
    await region.ready(1)
    out = tmp_path / "env"
    out.mkdir()
    # Task 0 ends the job once every task has written what it was told; the others
    # would run for five minutes.
    cmd = (
        f"env | grep ^MESH_ | sort > {out}/$MESH_TASK_INDEX.tmp && "
        f"mv {out}/$MESH_TASK_INDEX.tmp {out}/$MESH_TASK_INDEX; "
        f'if [ "$MESH_TASK_INDEX" = 0 ]; then '
        f"while [ $(ls {out} | grep -cv tmp) -lt 3 ]; do sleep 0.05; done; exit 0; fi; "
        "exec sleep 300"
    )
    spec = {
        "name": "prim",
        "tasks": [
            {"role": "w", "count": 3, "command": ["sh", "-c", cmd], "resources": {"cpu": "100m"}}
        ],
    }
    job_id = await region.client.submit(spec)
    job = await region.client.wait(job_id, timeout=30)
    assert job["state"] == "SUCCEEDED"  # the primary's outcome, not KILLED
    tasks = {t["index"]: t for t in job["task_list"]}
    assert tasks[0]["state"] == "SUCCEEDED"
    assert tasks[1]["state"] == tasks[2]["state"] == "KILLED"
    assert job["kill_reason"] == f"primary task {job_id}.w.0 succeeded: the job ends with it"
    ports = {i: t["ports"]["rdzv"] for i, t in tasks.items()}
    assert len(set(ports.values())) == 3
    assert all(RANGE[0] <= p <= RANGE[1] for p in ports.values())
    for i in range(3):
        env = dict(line.split("=", 1) for line in (out / str(i)).read_text().splitlines())
        assert env["MESH_PORT_RDZV"] == str(ports[i])
        assert env["MESH_W_HOSTS"] == "127.0.0.1,127.0.0.1,127.0.0.1"
        assert env["MESH_W_NUM"] == "3" and env["MESH_TASK_INDEX"] == str(i)
        assert env["MESH_JOB_ID"] == job_id

    # A plain batch job on the same node is untouched: no ports, no MESH_ variables.
    plain = await region.client.submit(
        {
            "name": "plain",
            "tasks": [{"role": "w", "command": ["sh", "-c", "env > " + str(tmp_path / "plain")]}],
        }
    )
    job = await region.client.wait(plain, timeout=20)
    assert job["state"] == "SUCCEEDED" and job["task_list"][0]["ports"] == {}
    await eventually(lambda: (tmp_path / "plain").exists())
    assert "MESH_PORT_" not in (tmp_path / "plain").read_text()
