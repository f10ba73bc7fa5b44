"""A site's leaf nats-server and its JetStream: what `mesh edge up` starts at a site.

The leaf has its own JetStream domain (`subjects.site_domain(S)`), so what the site's
agents publish is stored at the site and acknowledged even while the hub is away; it
dials out to the hub (no inbound port at the site), with short pings so a black-holed
link is noticed in seconds (nats-server's 2 min x 2 default takes minutes). Its store
is bounded well below the disk: a full disk (ENOSPC) switches JetStream off, which
would refuse every event. The site events stream discards NEW when full, so a full
site refuses an event (the agent keeps it and retries) rather than drop an old one
not yet forwarded.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from nats.js import JetStreamContext
from nats.js.api import KeyValueConfig, StorageType
from nats.js.errors import BadRequestError, BucketNotFoundError
from nats.js.kv import KeyValue

from mesh import subjects
from mesh.server import ServerConfig, TlsFiles
from mesh.streams import ensure_site_stream, site_stream_config

__all__ = [
    "ensure_link_bucket",
    "ensure_site_stream",
    "site_server_config",
    "site_stream_config",
    "store_bound",
    "stream_bound",
]

MiB = 1024 * 1024
STORE_CAP = 1024 * MiB  # the most a site's JetStream store takes
STORE_FLOOR = 16 * MiB  # below this the disk is too small for a site
PING_INTERVAL = "1s"
PING_MAX = 3
RECONNECT = "250ms"  # a link back is used within a quarter second (nats-server: 1 s)


def store_bound(disk_free: int, cap: int = STORE_CAP) -> int:
    """The site's JetStream file store bound: a quarter of the disk's free space, at
    most `cap`, at least STORE_FLOOR (a disk that small fails the site at start-up,
    with a clear error, rather than at the first event)."""
    return max(STORE_FLOOR, min(cap, disk_free // 4))


def stream_bound(store: int) -> int:
    """The site events stream's max_bytes: half the store (the cursor bucket and any
    other site stream share the rest)."""
    return store // 2


def site_server_config(
    site: str,
    hub_urls: list[str],
    store_dir: str | Path,
    *,
    port: int = 0,
    host: str = "127.0.0.1",
    leaf_tls: TlsFiles | None = None,
    tls: TlsFiles | None = None,
    store_bytes: int | None = None,
    ping_interval: str = PING_INTERVAL,
    ping_max: int = PING_MAX,
) -> ServerConfig:
    """The leaf server of `site`: its domain, its remote to the hub (`leaf_tls`: the
    site's client certificate for the link), short pings, a bounded store (None: from
    the disk under `store_dir`). `tls`: the leaf's own client port's TLS (agents)."""
    subjects.token(site, "site")
    if not hub_urls:
        raise ValueError("a site needs at least one hub URL to dial")
    Path(store_dir).mkdir(parents=True, exist_ok=True)
    if store_bytes is None:
        store_bytes = store_bound(shutil.disk_usage(store_dir).free)
    return ServerConfig(
        port=port,
        host=host,
        store_dir=str(store_dir),
        server_name=f"leaf-{site}",
        domain=subjects.site_domain(site),
        leaf_remotes=list(hub_urls),
        leaf_only_listed=True,
        leaf_reconnect=RECONNECT,
        leaf_tls=leaf_tls,
        tls=tls,
        ping_interval=ping_interval,
        ping_max=ping_max,
        max_file_store=f"{max(1, store_bytes // MiB)}M",
    )


async def ensure_link_bucket(js: JetStreamContext, site: str) -> KeyValue:
    """The site link's KV bucket on the leaf (its forwarding cursor)."""
    name = subjects.site_link_bucket(site)
    try:
        return await js.key_value(name)
    except BucketNotFoundError:
        pass
    try:
        return await js.create_key_value(
            KeyValueConfig(bucket=name, history=1, storage=StorageType.FILE, max_bytes=MiB)
        )
    except BadRequestError:
        return await js.key_value(name)
