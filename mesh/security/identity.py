"""Who a client is, and where its certificate and key live by convention.

A certificate's subject is `CN=<common name>` and nothing else, so the user name the
server maps it to (`verify_and_map`) is `CN=<common name>`:

| identity          | common name    | files in the certificate dir     | inbox prefix          |
|-------------------|----------------|----------------------------------|-----------------------|
| the coordinators  | `coordinator`  | coordinator.crt, coordinator.key | `_INBOX.coordinator`  |
| the agent of NODE | `agent:NODE`   | agent-NODE.crt, agent-NODE.key   | `_INBOX.agent.NODE`   |
| a hollow fleet    | `fleet:PREFIX` | fleet-PREFIX.crt, ...            | `_INBOX.fleet.PREFIX` |
| a user NAME       | `user:NAME`    | user-NAME.crt, user-NAME.key     | `_INBOX.user.NAME`    |
| inference router  | `router:NAME`  | router-NAME.crt, router-NAME.key | `_INBOX.router.NAME`  |
| inference workers | `worker:NAME`  | worker-NAME.crt, worker-NAME.key | `_INBOX.worker.NAME`  |
| an edge site S    | `site:S`       | site-S.crt, site-S.key           | `_INBOX.site.S`       |

A `site` identity is a leaf server's, not a client's: the hub maps the certificate the
site's leaf presents on its leafnode link to `CN=site:S`, and that user's permissions
bound everything that crosses the link (docs/security.md, "Edge sites"). The same
certificate is the leaf's server certificate towards the site's own agents, so it
names hosts too (`mesh certs issue --site S --host NAME`).

A `worker` identity is not a process's own: an agent holds one (`mesh agent
--task-identity DIR`, named after its node by default) and hands its files to the tasks
that ask for it (inference workers, a horovod-elastic job's launcher, which may call
`job.hosts`), never its own `agent:NODE` key.

Each identity receives replies only on its own inbox prefix: with the default shared
`_INBOX.>` any client could subscribe to every reply, including the assignments the
server delivers to another agent's pull requests.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from mesh import subjects

AGENT, FLEET, USER, COORDINATOR = "agent", "fleet", "user", "coordinator"
ROUTER, WORKER = "router", "worker"  # inference: the router, and the workers agents run
SITE = "site"  # an edge site's leaf server (its leafnode link to the hub)
KINDS = (AGENT, FLEET, USER, COORDINATOR, ROUTER, WORKER, SITE)
CA_CERT, CA_KEY = "ca.crt", "ca.key"
SERVER_CERT, SERVER_KEY = "server.crt", "server.key"


class IdentityError(ValueError):
    """A malformed identity or common name."""


@dataclass(frozen=True)
class Identity:
    kind: str
    name: str = ""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise IdentityError(f"unknown identity kind {self.kind!r}")
        if self.kind == COORDINATOR:
            if self.name:
                raise IdentityError("the coordinator identity has no name")
        else:
            try:
                subjects.token(self.name, f"{self.kind} name")
            except subjects.SubjectError as exc:
                raise IdentityError(str(exc)) from None

    @classmethod
    def agent(cls, node_id: str) -> Identity:
        return cls(AGENT, node_id)

    @classmethod
    def fleet(cls, prefix: str) -> Identity:
        return cls(FLEET, prefix)

    @classmethod
    def user(cls, name: str) -> Identity:
        return cls(USER, name)

    @classmethod
    def coordinator(cls) -> Identity:
        return cls(COORDINATOR)

    @classmethod
    def router(cls, name: str) -> Identity:
        return cls(ROUTER, name)

    @classmethod
    def worker(cls, name: str) -> Identity:
        return cls(WORKER, name)

    @classmethod
    def site(cls, name: str) -> Identity:
        return cls(SITE, name)

    @classmethod
    def parse(cls, common_name: str) -> Identity:
        """`coordinator`, `agent:NODE`, `fleet:PREFIX`, `user:NAME`, `router:NAME`,
        `worker:NAME` or `site:S`."""
        if common_name == COORDINATOR:
            return cls.coordinator()
        kind, sep, name = common_name.partition(":")
        if not sep or kind == COORDINATOR:
            raise IdentityError(f"not a mesh identity: {common_name!r}")
        return cls(kind, name)

    @property
    def common_name(self) -> str:
        return COORDINATOR if self.kind == COORDINATOR else f"{self.kind}:{self.name}"

    @property
    def user_name(self) -> str:
        """The name `verify_and_map` gives a client presenting this identity's certificate."""
        return f"CN={self.common_name}"

    @property
    def stem(self) -> str:
        return COORDINATOR if self.kind == COORDINATOR else f"{self.kind}-{self.name}"

    @property
    def inbox_prefix(self) -> str:
        return "_INBOX." + (COORDINATOR if self.kind == COORDINATOR else f"{self.kind}.{self.name}")

    def cert_path(self, certs_dir: str | Path) -> Path:
        return Path(certs_dir) / f"{self.stem}.crt"

    def key_path(self, certs_dir: str | Path) -> Path:
        return Path(certs_dir) / f"{self.stem}.key"

    def __str__(self) -> str:
        return self.common_name
