"""What a task is told about the mesh it runs in (MESH_NATS_URL, MESH_REGION): enough
for `mesh job hosts` (a horovod discovery script) to reach the API, never the agent's
credentials, which an operator may have put in its URL."""

from __future__ import annotations

import pytest

from agent.service import Agent, AgentConfig
from agent.training import task_nats_url


@pytest.mark.parametrize(
    ("url", "told"),
    [
        ("nats://127.0.0.1:4222", "nats://127.0.0.1:4222"),
        ("tls://nats.example.org:4222", "tls://nats.example.org:4222"),
        ("nats://user:secret@10.0.0.5:4222", "nats://10.0.0.5:4222"),
        ("nats://tok@a:4222, tls://u:p@b:4443/", "nats://a:4222,tls://b:4443/"),
        ("u:p@host:4222", "host:4222"),  # no scheme: nats-py's default
        ("nats://p@ss@h:1", "nats://h:1"),  # an @ in the password too
    ],
)
def test_task_nats_url_drops_credentials(url, told):
    assert task_nats_url(url) == told


def test_agent_tells_its_tasks_its_url_without_credentials(tmp_path):
    agent = Agent(
        AgentConfig("nats://ops:hunter2@127.0.0.1:4222", region="eu", data_dir=str(tmp_path))
    )
    env = agent.task_env()
    assert env == {"MESH_NATS_URL": "nats://127.0.0.1:4222", "MESH_REGION": "eu"}
    assert "hunter2" not in repr(env)
