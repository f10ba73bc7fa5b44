"""Shared fixtures: real nats-server processes on free loopback ports, never a mocked broker."""

from __future__ import annotations

import pytest

from mesh.connect import connect
from mesh.server import EmbeddedServer


@pytest.fixture
def nats_server(tmp_path):
    server = EmbeddedServer()
    server.config.store_dir = str(tmp_path / "nats")
    server.start()
    yield server
    server.stop()


@pytest.fixture
async def nc(nats_server):
    conn = await connect(nats_server.url, name="test")
    yield conn
    await conn.close()


# What tells the CLI where and as whom to connect: a test of that logic starts from none.
CLIENT_ENV = (
    "MESH_NATS_URL",
    "MESH_REGION",
    "MESH_CERTS",
    "MESH_USER",
    "MESH_INSECURE",
    "MESH_CONTEXT",
)


@pytest.fixture
def bare_client_env(tmp_path, monkeypatch):
    """A fresh MESH_HOME and none of the CLIENT_ENV variables."""
    monkeypatch.setenv("MESH_HOME", str(tmp_path / "home"))
    for var in CLIENT_ENV:
        monkeypatch.delenv(var, raising=False)
    return monkeypatch
