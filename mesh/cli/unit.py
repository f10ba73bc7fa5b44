"""What `mesh agent install` writes, as pure functions of an `AgentInstall`: the systemd
unit, its environment file, and where everything goes. No I/O here (`mesh.cli.install`
does that), so the whole content is unit-tested and `--dry-run` shows exactly it.

Layout (every path under `root`, "/" for a real install):

    /etc/systemd/system/mesh-agent.service  the unit                       0644 root
    /etc/mesh/agent.env                     MESH_NATS_URL, MESH_REGION...  0644 root
    /etc/mesh/agent/                        the node's identity (bundle)   0700 root
    /var/lib/mesh/agent/                    the agent's data               0750 root:USER's group

The agent runs as root so that it can start tasks as `--run-as USER` and give them
cgroups; the data directory is group-readable by USER's group only because the task
user must reach its task directories (exit files) under it, while the task store there
holds env values that other local users must not read.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from mesh import signing, subjects
from mesh.security.identity import CA_CERT, Identity

UNIT_NAME = "mesh-agent.service"
SYSTEMD_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"  # its default
_PLAIN = re.compile(r"[A-Za-z0-9_@%+=:,./-]+")


class UnitError(ValueError):
    """A value that cannot go into a unit or environment file as given."""


@dataclass(frozen=True)
class Layout:
    """Where an install puts things: every path under `root` ("/" for a real one)."""

    root: Path = Path("/")

    def under(self, path: str) -> Path:
        return self.root / path.lstrip("/")

    @property
    def unit_path(self) -> Path:
        return self.under(f"/etc/systemd/system/{UNIT_NAME}")

    @property
    def env_path(self) -> Path:
        return self.under("/etc/mesh/agent.env")

    @property
    def config_dir(self) -> Path:
        return self.under("/etc/mesh/agent")

    @property
    def home(self) -> Path:
        """$MESH_HOME of the agent: no operator's `mesh up` context is ever picked up."""
        return self.under("/var/lib/mesh")

    @property
    def data_dir(self) -> Path:
        return self.under("/var/lib/mesh/agent")

    @property
    def verify_key(self) -> Path:
        return self.config_dir / signing.PUB_FILE

    def identity_files(self, node_id: str) -> list[Path]:
        """What the agent of `node_id` needs in its config dir on a secure mesh."""
        ident = Identity.agent(node_id)
        return [
            self.config_dir / CA_CERT,
            ident.cert_path(self.config_dir),
            ident.key_path(self.config_dir),
            self.verify_key,
        ]


@dataclass(frozen=True)
class AgentInstall:
    """One node's agent install. `python` runs `-m mesh.cli.main` (the interpreter whose
    environment has mesh installed: the installer's own by default)."""

    nats_url: str
    region: str
    node_id: str
    python: str
    layout: Layout = Layout()
    run_as: str | None = None
    allow_root: bool = False
    labels: tuple[tuple[str, str], ...] = ()
    insecure: bool = False
    log_level: str = "info"


def _check_line(value: str, what: str) -> str:
    if not value or any(c in value for c in "\n\r\0"):
        raise UnitError(f"{what} {value!r}: empty, or has a line break or NUL")
    return value


def exec_argv(i: AgentInstall) -> list[str]:
    """The agent's command line. Connection settings come from the environment file."""
    argv = [i.python, "-m", "mesh.cli.main", "--log-level", i.log_level, "agent"]
    argv += ["--node-id", i.node_id, "--data-dir", str(i.layout.data_dir)]
    if not i.insecure:
        argv += ["--verify-key", str(i.layout.verify_key)]
    if i.run_as:
        argv += ["--run-as", i.run_as]
    if i.allow_root:
        argv.append("--allow-root")
    for key, value in i.labels:
        argv += ["--label", f"{key}={value}"]
    return [_check_line(a, "argument") for a in argv]


def systemd_quote(arg: str) -> str:
    """One argument of an ExecStart= line: `%` and `$` doubled (systemd expands both),
    anything but plain characters in double quotes with `\\` and `"` escaped."""
    out = arg.replace("%", "%%").replace("$", "$$")
    if _PLAIN.fullmatch(arg):
        return out
    return '"' + out.replace("\\", "\\\\").replace('"', '\\"') + '"'


def environment(i: AgentInstall) -> dict[str, str]:
    try:
        subjects.token(i.region, "region")
    except subjects.SubjectError as exc:
        raise UnitError(str(exc)) from None
    env = {
        "MESH_NATS_URL": i.nats_url,
        "MESH_REGION": i.region,
        "MESH_HOME": str(i.layout.home),
    }
    if i.insecure:
        env["MESH_INSECURE"] = "1"
    else:
        env["MESH_CERTS"] = str(i.layout.config_dir)
    return env


def render_env(i: AgentInstall) -> str:
    lines = ["# Written by `mesh agent install`: where the agent connects, as whom."]
    for key, value in environment(i).items():
        if not _PLAIN.fullmatch(value):
            raise UnitError(f"{key}={value!r}: only plain characters fit an environment file")
        lines.append(f"{key}={value}")
    return "\n".join(lines) + "\n"


def render_unit(i: AgentInstall) -> str:
    exec_start = " ".join(systemd_quote(a) for a in exec_argv(i))
    if not _PLAIN.fullmatch(str(i.layout.env_path)):
        raise UnitError(f"{i.layout.env_path}: only plain characters fit a unit's EnvironmentFile=")
    return f"""\
# Written by `mesh agent install`; `mesh agent uninstall` removes it.
[Unit]
Description=Mesh node agent (node {i.node_id}, region {i.region})
Wants=network-online.target
After=network-online.target
# Keep trying while NATS is unreachable: a node must come back after an outage.
StartLimitIntervalSec=0

[Service]
Type=exec
EnvironmentFile={i.layout.env_path}
ExecStart={exec_start}
Restart=on-failure
RestartSec=5
# Stop the agent only: its tasks keep running, and the restarted agent re-adopts them.
KillMode=process
# Tasks get their own cgroups (memory and cpu limits) below the agent's.
Delegate=yes
TasksMax=infinity
# Hardening that still lets tasks run as other users, reach GPUs and get cgroup limits.
ProtectSystem=full
ProtectKernelModules=yes
ProtectKernelLogs=yes
ProtectHostname=yes
RestrictRealtime=yes
RestrictSUIDSGID=yes
LockPersonality=yes
# Left out on purpose (docs/install.md): NoNewPrivileges (tasks may need setuid
# programs), ProtectControlGroups (cgroup limits), ProtectHome and PrivateTmp (tasks
# use homes and /tmp, and outlive an agent restart), PrivateDevices, DeviceAllow and
# ProtectClock (they close /dev to GPUs), User= (run-as needs root).

[Install]
WantedBy=multi-user.target
"""


def parse_exec_start(unit_text: str) -> list[str]:
    """The argv of a unit's ExecStart= line as systemd reads what `render_unit` writes
    (the inverse of `systemd_quote` over a line; for tests and `--dry-run` readers)."""
    (line,) = [x for x in unit_text.splitlines() if x.startswith("ExecStart=")]
    text = line.removeprefix("ExecStart=")
    argv, i = [], 0
    while i < len(text):
        if text[i] == " ":
            i += 1
            continue
        word = []
        if text[i] == '"':
            i += 1
            while text[i] != '"':
                if text[i] == "\\":
                    i += 1
                word.append(text[i])
                i += 1
            i += 1
        else:
            while i < len(text) and text[i] != " ":
                word.append(text[i])
                i += 1
        argv.append("".join(word).replace("%%", "%").replace("$$", "$"))
    return argv


def parse_env(env_text: str) -> dict[str, str]:
    """KEY=VALUE lines of an environment file as `render_env` writes them."""
    out = {}
    for line in env_text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            out[key] = value
    return out
