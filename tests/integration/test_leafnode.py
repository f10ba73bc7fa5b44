"""A real hub and site leaf pair from `mesh.server.ServerConfig`: distinct JetStream
domains, the leaf dialling out to the hub, each JetStream reached from the leaf."""

from __future__ import annotations

import nats
import pytest

from mesh import subjects
from mesh.server import EmbeddedServer, ServerConfig, TlsFiles, UserPermission
from tests.integration.conftest import eventually


def test_leaf_blocks_render():
    hub = ServerConfig(domain="hub", leaf_listen=True, leaf_port=7422, ping_interval="1s")
    text = hub.render()
    assert 'domain: "hub"' in text and 'listen: "127.0.0.1:7422"' in text
    assert 'ping_interval: "1s"' in text
    leaf = ServerConfig(
        domain="site-a", leaf_remotes=["nats://h:7422"], ping_max=3, max_file_store="64M"
    )
    text = leaf.render()
    assert "remotes: [" in text and '"nats://h:7422"' in text
    assert "ping_max: 3" in text and 'max_file_store: "64M"' in text


@pytest.fixture
def hub_and_leaf(tmp_path):
    hub = EmbeddedServer(
        ServerConfig(store_dir=str(tmp_path / "hub"), domain=subjects.HUB_DOMAIN, leaf_listen=True)
    ).start()
    leaf = EmbeddedServer(
        ServerConfig(
            store_dir=str(tmp_path / "leaf"),
            domain=subjects.site_domain("a"),
            leaf_remotes=[hub.leaf_url],
            ping_interval="1s",
            ping_max=3,
        )
    ).start()
    yield hub, leaf
    leaf.stop()
    hub.stop()


async def test_leaf_client_reaches_both_domains(hub_and_leaf):
    hub, leaf = hub_and_leaf
    hub_nc = await nats.connect(hub.url)
    leaf_nc = await nats.connect(leaf.url)
    try:
        await hub_nc.jetstream().add_stream(name="HUBS", subjects=["hub.>"])
        leaf_local = leaf_nc.jetstream()
        leaf_hub = leaf_nc.jetstream(domain=subjects.HUB_DOMAIN)

        async def linked() -> bool:
            try:
                await leaf_hub.stream_info(
                    "HUBS",
                )
                return True
            except Exception:
                return False

        assert await eventually(linked, timeout=10)
        await leaf_local.add_stream(name="SITE", subjects=["site.>"])
        ack = await leaf_hub.publish("hub.x", b"1", stream="HUBS")
        assert ack.stream == "HUBS" and ack.domain == subjects.HUB_DOMAIN
        ack = await leaf_local.publish("site.x", b"2", stream="SITE")
        assert ack.stream == "SITE" and ack.domain == subjects.site_domain("a")
        # Each stream lives only in its own domain.
        assert (await hub_nc.jetstream().stream_info("HUBS")).state.messages == 1
        names = [s.config.name for s in await hub_nc.jetstream().streams_info()]
        assert "SITE" not in names
        assert (await leaf_local.stream_info("SITE")).state.messages == 1
    finally:
        await leaf_nc.close()
        await hub_nc.close()


def test_leaf_tls_blocks_render():
    """A hub with TLS verifies the leaf's certificate and maps it to its user (no
    leafnodes authorization block: its users carry no permissions); a leaf's remote
    presents one."""
    files = TlsFiles(ca="/c/ca.crt", cert="/c/s.crt", key="/c/s.key")
    hub = ServerConfig(
        domain="hub", leaf_listen=True, tls=files, users=[UserPermission("u", [">"], [">"])]
    )
    block = hub.render().split("leafnodes {")[1]
    assert "verify_and_map: true" in block.split("}")[0] and '"/c/ca.crt"' in block
    assert "authorization" not in block.split("}")[0]
    verify_only = ServerConfig(leaf_listen=True, tls=TlsFiles("/c/ca", "/c/s", "/c/k", False))
    assert "    verify: true" in verify_only.render().split("leafnodes {")[1]
    leaf = ServerConfig(
        leaf_remotes=["tls://hub:7422"],
        leaf_tls=files,
        leaf_only_listed=True,
        leaf_reconnect="250ms",
    )
    text = leaf.render()
    assert 'tls {cert_file: "/c/s.crt", key_file: "/c/s.key", ca_file: "/c/ca.crt"' in text
    assert "ignore_discovered_servers: true" in text and 'reconnect: "250ms"' in text
