"""`mesh agent install` / `uninstall`: the unit and env file it renders (pure), the whole
install into a temporary root (files, modes, owners, content), `systemd-analyze verify`
of the unit, and clear refusals. The unit's command line running a real agent against
a secure nats-server is tests/integration/test_agent_install.py."""

from __future__ import annotations

import grp
import os
import pwd
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from mesh.cli.main import main
from mesh.cli.parser import build_parser
from mesh.cli.unit import (
    AgentInstall,
    Layout,
    UnitError,
    exec_argv,
    parse_env,
    parse_exec_start,
    render_env,
    render_unit,
    systemd_quote,
)
from mesh.security import bundle, pki
from mesh.security.identity import Identity

ROOT_UID = 0 if os.geteuid() == 0 else os.geteuid()  # owners are set only by root
TASK_USER = "nobody"


def spec(tmp_path: Path, **kw) -> AgentInstall:
    kw.setdefault("run_as", TASK_USER)
    kw.setdefault("python", sys.executable)
    return AgentInstall(
        nats_url="tls://nats.example.org:4222",
        region="eu",
        node_id="gpu-07",
        layout=Layout(tmp_path),
        **kw,
    )


def service_lines(unit: str) -> dict[str, str]:
    out = {}
    for line in unit.splitlines():
        if "=" in line and not line.startswith("#"):
            key, _, value = line.partition("=")
            out[key] = value
    return out


# ------------------------------------------------------------------ pure rendering


def test_unit_keeps_tasks_on_stop_and_restarts_on_failure(tmp_path):
    unit = render_unit(spec(tmp_path))
    keys = service_lines(unit)
    assert keys["Restart"] == "on-failure"
    assert keys["KillMode"] == "process"  # tasks outlive the agent, to be re-adopted
    assert keys["Delegate"] == "yes"  # cgroup limits for tasks below the agent's cgroup
    assert keys["EnvironmentFile"] == str(tmp_path / "etc/mesh/agent.env")
    assert keys["WantedBy"] == "multi-user.target"
    # Settings that would break tasks running as other users, GPUs or cgroup limits.
    for broken in ("NoNewPrivileges", "ProtectControlGroups", "PrivateDevices", "User"):
        assert broken not in keys, broken
    for broken in ("ProtectHome", "PrivateTmp", "DeviceAllow", "ProtectClock"):
        assert broken not in keys, broken
    argv = parse_exec_start(unit)
    assert argv == exec_argv(spec(tmp_path))
    assert argv[:3] == [sys.executable, "-m", "mesh.cli.main"]
    assert argv[argv.index("--node-id") + 1] == "gpu-07"
    assert argv[argv.index("--run-as") + 1] == TASK_USER
    assert argv[argv.index("--data-dir") + 1] == str(tmp_path / "var/lib/mesh/agent")
    assert argv[argv.index("--verify-key") + 1] == str(tmp_path / "etc/mesh/agent/assignments.pub")
    assert "--allow-root" not in argv


def test_env_file_says_where_and_as_whom(tmp_path):
    env = parse_env(render_env(spec(tmp_path)))
    assert env == {
        "MESH_NATS_URL": "tls://nats.example.org:4222",
        "MESH_REGION": "eu",
        "MESH_HOME": str(tmp_path / "var/lib/mesh"),
        "MESH_CERTS": str(tmp_path / "etc/mesh/agent"),
    }
    insecure = parse_env(render_env(spec(tmp_path, insecure=True)))
    assert insecure["MESH_INSECURE"] == "1" and "MESH_CERTS" not in insecure
    assert "--verify-key" not in exec_argv(spec(tmp_path, insecure=True))
    with pytest.raises(UnitError):
        render_env(AgentInstall("tls://x:1\nEVIL=1", "eu", "n", sys.executable))


@pytest.mark.parametrize("value", ["plain", "a b", "100%", "$HOME", 'say "hi"', "back\\slash"])
def test_labels_survive_systemd_quoting(tmp_path, value):
    i = spec(tmp_path, labels=(("note", value),))
    argv = parse_exec_start(render_unit(i))
    assert argv[-2:] == ["--label", f"note={value}"]
    quoted = systemd_quote(value)
    assert "%" not in quoted.replace("%%", "") and "$" not in quoted.replace("$$", "")


def test_a_line_break_cannot_reach_the_unit(tmp_path):
    with pytest.raises(UnitError):
        render_unit(spec(tmp_path, labels=(("k", "v\nExecStartPre=/bin/evil"),)))


def test_systemd_analyze_verifies_the_unit(tmp_path):
    if shutil.which("systemd-analyze") is None:  # .ci/run installs it
        pytest.fail("systemd-analyze is missing: apt-get install -y systemd")
    for kw in ({}, {"run_as": None, "allow_root": True, "labels": (("a", "b c"),)}):
        i = spec(tmp_path, **kw)
        i.layout.unit_path.parent.mkdir(parents=True, exist_ok=True)
        i.layout.unit_path.write_text(render_unit(i))
        r = subprocess.run(
            ["systemd-analyze", "verify", str(i.layout.unit_path)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert r.returncode == 0 and r.stdout + r.stderr == "", r.stdout + r.stderr


def test_systemd_analyze_would_catch_a_broken_unit(tmp_path):
    """The check above is not vacuous: a unit whose ExecStart cannot run is refused."""
    i = spec(tmp_path, python=str(tmp_path / "no-python"))
    path = tmp_path / "mesh-agent.service"
    path.write_text(render_unit(i))
    r = subprocess.run(["systemd-analyze", "verify", str(path)], capture_output=True, text=True)
    assert r.returncode != 0 and "not executable" in r.stderr


# ------------------------------------------------------------- the whole install


@pytest.fixture
def node_bundle(tmp_path):
    certs = tmp_path / "certs"
    pki.init(certs)
    pki.issue(certs, Identity.agent("gpu-07"))
    return certs, bundle.write(bundle.collect(certs, "gpu-07"), tmp_path / "gpu-07.tar.gz")


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def install_argv(root: Path, b: Path, *more: str) -> list[str]:
    return [
        "agent",
        "install",
        "--nats",
        "tls://nats.example.org:4222",
        "--region",
        "eu",
        "--bundle",
        str(b),
        "--root",
        str(root),
        *more,
    ]


def test_install_into_a_root(tmp_path, node_bundle, capsys):
    certs, b = node_bundle
    root = tmp_path / "root"
    argv = install_argv(root, b, "--run-as", TASK_USER, "--label", "zone=a", "--label", "gpu=h200")
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "agent gpu-07, region eu" in out
    assert "systemctl not run" in out and "systemctl enable mesh-agent.service" in out

    conf = root / "etc/mesh/agent"
    assert mode(conf) == 0o700
    for name in ("ca.crt", "agent-gpu-07.crt", "assignments.pub"):
        assert (conf / name).read_bytes() == (certs / name).read_bytes()
        assert mode(conf / name) == 0o644
    assert (conf / "agent-gpu-07.key").read_bytes() == (certs / "agent-gpu-07.key").read_bytes()
    assert mode(conf / "agent-gpu-07.key") == 0o600
    assert not (conf / "ca.key").exists() and not (conf / "bundle.json").exists()

    unit = root / "etc/systemd/system/mesh-agent.service"
    env = root / "etc/mesh/agent.env"
    assert mode(unit) == 0o644 and mode(env) == 0o644
    argv_run = parse_exec_start(unit.read_text())
    assert argv_run.count("--label") == 2 and "zone=a" in argv_run and "gpu=h200" in argv_run
    assert parse_env(env.read_text())["MESH_CERTS"] == str(conf)

    data = root / "var/lib/mesh/agent"
    assert mode(data) == 0o750  # the task user's group may traverse it; others may not
    task_gid = pwd.getpwnam(TASK_USER).pw_gid
    for path in (unit, env, conf, conf / "agent-gpu-07.key"):
        assert path.stat().st_uid == ROOT_UID
    assert data.stat().st_uid == ROOT_UID
    if os.geteuid() == 0:
        assert data.stat().st_gid == task_gid, grp.getgrgid(data.stat().st_gid)

    # uninstall: unit, env and identity gone, data kept; --purge takes the data too
    (data / "agent.db").write_text("state")
    assert main(["agent", "uninstall", "--root", str(root)]) == 0
    assert "kept" in capsys.readouterr().out
    assert not unit.exists() and not env.exists() and not conf.exists()
    assert (data / "agent.db").exists()
    assert main(["agent", "uninstall", "--root", str(root), "--purge"]) == 0
    assert not data.exists()


def test_dry_run_prints_everything_and_writes_nothing(tmp_path, node_bundle, capsys):
    _, b = node_bundle
    root = tmp_path / "root"
    assert main([*install_argv(root, b, "--allow-root"), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert not root.exists()
    for path in (
        "etc/mesh/agent/agent-gpu-07.key",
        "etc/mesh/agent/ca.crt",
        "etc/mesh/agent.env",
        "etc/systemd/system/mesh-agent.service",
    ):
        assert f"would write {root / path}" in out
    assert f"would make directory {root / 'var/lib/mesh/agent'} (0700" in out
    assert "    | KillMode=process" in out and "    | MESH_REGION=eu" in out  # contents shown
    assert "BEGIN PRIVATE KEY" not in out  # never the key
    for cmd in ("daemon-reload", "enable mesh-agent.service", "restart mesh-agent.service"):
        assert f"would run: systemctl {cmd}" in out
    assert main(["agent", "uninstall", "--root", str(root), "--purge", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "would run: systemctl disable --now mesh-agent.service" in out
    assert f"would remove {root / 'var/lib/mesh/agent'}" in out


def test_reinstall_without_a_bundle_keeps_the_identity(tmp_path, node_bundle, capsys):
    _, b = node_bundle
    root = tmp_path / "root"
    assert main(install_argv(root, b, "--allow-root")) == 0
    base = ["agent", "install", "--nats", "tls://other:4222", "--root", str(root)]
    assert main([*base, "--node-id", "gpu-07", "--allow-root"]) == 0
    env = parse_env((root / "etc/mesh/agent.env").read_text())
    assert env["MESH_NATS_URL"] == "tls://other:4222"
    assert (root / "etc/mesh/agent/agent-gpu-07.key").exists()
    capsys.readouterr()
    assert main([*base, "--node-id", "gpu-08", "--allow-root"]) == 2  # no identity for it
    assert "mesh certs bundle DIR --agent gpu-08" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("more", "message"),
    [
        ([], "--run-as USER"),
        (["--run-as", "no-such-user-here"], "no such user"),
        (["--allow-root", "--node-id", "gpu-08"], "--node-id gpu-08 but"),
        (["--allow-root", "--label", "novalue"], "KEY=VALUE"),
        (["--allow-root", "--region", "a.b"], "region"),
    ],
)
def test_install_mistakes_exit_2(tmp_path, node_bundle, capsys, more, message):
    _, b = node_bundle
    root = tmp_path / "root"
    assert main(install_argv(root, b, *more)) == 2
    assert message in capsys.readouterr().err
    assert not (root / "etc/systemd").exists()  # nothing half-installed


def test_install_needs_nats_and_a_real_bundle(tmp_path, capsys):
    root = str(tmp_path / "root")
    assert main(["agent", "install", "--allow-root", "--root", root]) == 2
    assert "--nats URL is required" in capsys.readouterr().err
    junk = tmp_path / "junk.tar.gz"
    junk.write_bytes(b"junk")
    argv = ["agent", "install", "--nats", "tls://x:4222", "--allow-root", "--root", root]
    assert main([*argv, "--bundle", str(junk)]) == 2
    assert "not a bundle" in capsys.readouterr().err


def test_agent_is_still_a_command_with_flags():
    p = build_parser()
    args = p.parse_args(["agent", "--node-id", "x", "--label", "a=b"])
    assert args.cmd == "agent" and args.agent_cmd is None and args.node_id == "x"
    args = p.parse_args(["--nats", "tls://h:1", "agent", "install", "--allow-root"])
    assert args.agent_cmd == "install" and args.nats == "tls://h:1"
    args = p.parse_args(["agent", "install", "--nats", "tls://h:2", "--region", "eu"])
    assert args.nats == "tls://h:2" and args.region == "eu"
