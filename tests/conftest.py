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
