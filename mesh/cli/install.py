"""`mesh agent install` / `mesh agent uninstall`: a node agent as a systemd service.

    mesh agent install --nats URL [--node-id ID] [--bundle FILE] [--run-as USER]
                       [--allow-root] [--label K=V ...] [--region R] [--root DIR] [--dry-run]
    mesh agent uninstall [--purge] [--root DIR] [--dry-run]

What is written comes from `mesh.cli.unit` (pure); this module plans the steps (files
with modes and owners, then systemctl commands), shows them (`--dry-run` shows them
all and does nothing) or carries them out. systemctl runs only where systemd is PID 1
and the root is "/"; elsewhere the commands are printed for the operator to run.
"""

from __future__ import annotations

import argparse
import grp
import os
import pwd
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from mesh.cli.context import Context
from mesh.cli.exitcodes import EXIT_FAILED, EXIT_OK, EXIT_USAGE
from mesh.cli.unit import UNIT_NAME, AgentInstall, Layout, UnitError, render_env, render_unit
from mesh.security import bundle as bundles
from mesh.security.identity import Identity, IdentityError

PUBLIC, PRIVATE, PRIVATE_DIR = 0o644, 0o600, 0o700


def add_parsers(agent: argparse.ArgumentParser) -> argparse._SubParsersAction:
    """`install` and `uninstall` under `mesh agent`, which stays a command of its own
    (`mesh agent --node-id X` runs the agent): the subcommand is optional."""
    sub = agent.add_subparsers(dest="agent_cmd", metavar="{install,uninstall,ledger}")
    ins = sub.add_parser(
        "install",
        help="install this node's agent as a systemd service (mesh-agent.service)",
        description="Write the agent's systemd unit, its environment file, its identity "
        "(from --bundle) and data directory, then enable and start it where systemd runs.",
    )
    # SUPPRESS: given before `agent` instead, the global flag stands.
    ins.add_argument("--nats", default=argparse.SUPPRESS, metavar="URL", help="NATS URL (required)")
    ins.add_argument("--region", default=argparse.SUPPRESS, help="region (default 'default')")
    ins.add_argument("--node-id", help="default: the bundle's node, else the host name")
    ins.add_argument(
        "--bundle", metavar="FILE", help="the node's identity, from `mesh certs bundle`"
    )
    ins.add_argument("--run-as", metavar="USER", help="run task commands as this user")
    ins.add_argument(
        "--allow-root",
        action="store_true",
        help="no --run-as: let the (root) agent run task commands as root",
    )
    ins.add_argument("--label", action="append", default=[], metavar="KEY=VALUE")
    _common(ins)
    un = sub.add_parser(
        "uninstall",
        help="stop, disable and remove the agent's service and config (data kept)",
    )
    un.add_argument("--purge", action="store_true", help="also remove the data directory")
    _common(un)
    return sub  # `mesh agent ledger` is added to it too (mesh/cli/ledger.py)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--root",
        default="/",
        metavar="DIR",
        help="install under DIR (every path, in the files too; systemctl is not run): "
        "for tests and trials",
    )
    p.add_argument(
        "--dry-run", action="store_true", help="print every file and command, change nothing"
    )


# ------------------------------------------------------------------------- plans


@dataclass(frozen=True)
class Write:
    """A file (`data`) or directory (`data is None`) with its mode and owner."""

    path: Path
    data: bytes | None
    mode: int
    uid: int = 0
    gid: int = 0
    show: bool = False  # print the content in --dry-run (never for keys)


@dataclass
class Plan:
    before: list[list[str]] = field(default_factory=list)  # commands, first
    writes: list[Write] = field(default_factory=list)
    removes: list[Path] = field(default_factory=list)
    after: list[list[str]] = field(default_factory=list)  # commands, last


def install_plan(
    i: AgentInstall, identity: dict[str, bytes] | None, data_gid: int, *, start: bool = True
) -> Plan:
    """The steps of an install. `identity` (file name -> bytes, from a bundle) goes into
    the config dir; None keeps what is there. `data_gid` owns the data dir (the run-as
    user's group, so tasks can reach their directories; 0 without --run-as)."""
    lay = i.layout
    plan = Plan()
    plan.writes.append(Write(lay.config_dir, None, PRIVATE_DIR))
    for name, data in sorted((identity or {}).items()):
        mode = PRIVATE if name.endswith(".key") else PUBLIC
        plan.writes.append(Write(lay.config_dir / name, data, mode))
    plan.writes.append(Write(lay.env_path, render_env(i).encode(), PUBLIC, show=True))
    plan.writes.append(Write(lay.home, None, 0o755))
    plan.writes.append(Write(lay.data_dir, None, 0o750 if data_gid else PRIVATE_DIR, 0, data_gid))
    plan.writes.append(Write(lay.unit_path, render_unit(i).encode(), PUBLIC, show=True))
    plan.after.append(["systemctl", "daemon-reload"])
    plan.after.append(["systemctl", "enable", UNIT_NAME])
    if start:  # restart: an agent already running picks up the new config
        plan.after.append(["systemctl", "restart", UNIT_NAME])
    return plan


def uninstall_plan(lay: Layout, *, purge: bool) -> Plan:
    plan = Plan(before=[["systemctl", "disable", "--now", UNIT_NAME]])
    plan.removes += [lay.unit_path, lay.env_path, lay.config_dir]
    if purge:
        plan.removes.append(lay.data_dir)
    plan.after.append(["systemctl", "daemon-reload"])
    return plan


# ------------------------------------------------------------------ doing a plan


def _owner(uid: int, gid: int) -> str:
    try:
        user = pwd.getpwuid(uid).pw_name
    except KeyError:
        user = str(uid)
    try:
        group = grp.getgrgid(gid).gr_name
    except KeyError:
        group = str(gid)
    return f"{user}:{group}"


def describe(plan: Plan, dry_run: bool) -> list[str]:
    verb = "would " if dry_run else ""
    lines = [f"{verb}run: {' '.join(c)}" for c in plan.before]
    for w in plan.writes:
        what = f"{w.mode:04o} {_owner(w.uid, w.gid)}"
        if w.data is None:
            lines.append(f"{verb}make directory {w.path} ({what})")
            continue
        lines.append(f"{verb}write {w.path} ({what}, {len(w.data)} bytes)")
        if dry_run and w.show:
            lines += [f"    | {x}" for x in w.data.decode().splitlines()]
    lines += [f"{verb}remove {p}" for p in plan.removes]
    lines += [f"{verb}run: {' '.join(c)}" for c in plan.after]
    return lines


def systemd_running() -> tuple[bool, str]:
    """(is systemd PID 1, PID 1's name): the test sd_booted() makes."""
    try:
        init = Path("/proc/1/comm").read_text().strip()
    except OSError:
        init = "unknown"
    return Path("/run/systemd/system").is_dir(), init


def _write(w: Write, as_root: bool) -> None:
    if w.data is None:
        w.path.mkdir(parents=True, exist_ok=True)
    else:
        w.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = w.path.with_name(f".{w.path.name}.tmp")
        tmp.unlink(missing_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, w.mode)
        with os.fdopen(fd, "wb") as f:
            f.write(w.data)
        if as_root:
            os.chown(tmp, w.uid, w.gid)
        os.chmod(tmp, w.mode)
        tmp.replace(w.path)  # atomic: never a half-written unit or key
        return
    if as_root:
        os.chown(w.path, w.uid, w.gid)
    os.chmod(w.path, w.mode)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def _run_commands(cmds: list[list[str]], *, stop_on_error: bool) -> int:
    for cmd in cmds:
        r = subprocess.run(cmd, capture_output=True, text=True)
        print(f"ran: {' '.join(cmd)}" + (f" (exit {r.returncode})" if r.returncode else ""))
        if r.returncode:
            print((r.stderr or r.stdout).strip(), file=sys.stderr)
            if stop_on_error:
                return EXIT_FAILED
    return EXIT_OK


def carry_out(plan: Plan, lay: Layout, *, dry_run: bool) -> int:
    """Do (or with `dry_run` only show) the plan; systemctl only where systemd runs this
    root, else the commands are printed for the operator."""
    active, init = systemd_running()
    use_systemd = active and lay.root == Path("/")
    if dry_run:
        print("\n".join(describe(plan, True)))
        if not use_systemd:
            print(_why_not_systemd(lay, init, active))
        return EXIT_OK
    as_root = os.geteuid() == 0
    if use_systemd and _run_commands(plan.before, stop_on_error=False):
        return EXIT_FAILED
    for w in plan.writes:
        _write(w, as_root)
    for p in plan.removes:
        _remove(p)
    done = Plan(writes=plan.writes, removes=plan.removes)
    print("\n".join(describe(done, False)))
    if not as_root:
        print(f"not root: owners left as {_owner(os.geteuid(), os.getegid())}")
    if use_systemd:
        code = _run_commands(plan.after, stop_on_error=True)
        if code == EXIT_OK and plan.writes:
            print(f"status: systemctl status {UNIT_NAME}; log: journalctl -u {UNIT_NAME}")
        return code
    print(_why_not_systemd(lay, init, active))
    for cmd in plan.before + plan.after:
        print(f"  {' '.join(cmd)}")
    return EXIT_OK


def _why_not_systemd(lay: Layout, init: str, active: bool) -> str:
    if lay.root != Path("/"):
        return f"--root {lay.root}: systemctl not run; on a real install it would run the above"
    if not active:
        return f"systemd is not running here (PID 1 is {init}): run these where it is:"
    return ""


# ----------------------------------------------------------------------- commands


def _labels(items: list[str]) -> tuple[tuple[str, str], ...]:
    out = []
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UnitError(f"--label {item!r}: expected KEY=VALUE")
        out.append((key, value))
    return tuple(out)


def _identity(args: argparse.Namespace, lay: Layout) -> tuple[str, dict[str, bytes] | None]:
    """(node id, identity files to write or None to keep the config dir's)."""
    if args.bundle:
        b = bundles.read(args.bundle)
        if args.node_id and args.node_id != b.node_id:
            raise UnitError(f"--node-id {args.node_id} but {args.bundle} is node {b.node_id}")
        files = {n: d for n, d in b.files.items() if n != bundles.MANIFEST}
        return b.node_id, files
    if args.node_id:
        node_id = args.node_id
    else:
        from agent.service import default_node_id

        node_id = default_node_id()
    Identity.agent(node_id)  # a valid name, or IdentityError
    if not args.insecure:
        missing = [p for p in lay.identity_files(node_id) if not p.is_file()]
        if missing:
            raise UnitError(
                f"no identity for agent {node_id}: {', '.join(map(str, missing))} missing; "
                f"give --bundle FILE (`mesh certs bundle DIR --agent {node_id}` on the "
                "operator's machine), or --insecure"
            )
    return node_id, None


def install(args: argparse.Namespace, ctx: Context) -> int:
    lay = Layout(Path(args.root).absolute())
    url = getattr(args, "nats", None)
    if not url:
        print("mesh agent install: --nats URL is required (the region's server)", file=sys.stderr)
        return EXIT_USAGE
    if not args.run_as and not args.allow_root:
        print(
            "mesh agent install: give --run-as USER (tasks run as USER; the agent runs as "
            "root to switch to it), or --allow-root to run tasks as root",
            file=sys.stderr,
        )
        return EXIT_USAGE
    if lay.root == Path("/") and os.geteuid() != 0 and not args.dry_run:
        print(
            "mesh agent install: writes /etc and /var/lib and starts a system service: run "
            "it as root (or try it with --dry-run, or --root DIR)",
            file=sys.stderr,
        )
        return EXIT_USAGE
    try:
        data_gid = 0
        if args.run_as:
            try:
                entry = pwd.getpwnam(args.run_as)
            except KeyError:
                raise UnitError(f"--run-as {args.run_as}: no such user on this host") from None
            data_gid = entry.pw_gid
        node_id, identity = _identity(args, lay)
        spec = AgentInstall(
            nats_url=url,
            region=ctx.region,
            node_id=node_id,
            python=sys.executable,
            layout=lay,
            run_as=args.run_as,
            allow_root=args.allow_root,
            labels=_labels(args.label),
            insecure=bool(args.insecure),
        )
        plan = install_plan(spec, identity, data_gid)
    except (UnitError, IdentityError, bundles.BundleError) as exc:
        print(f"mesh agent install: {exc}", file=sys.stderr)
        return EXIT_USAGE
    print(f"agent {node_id}, region {spec.region}, NATS {url}, tasks as {args.run_as or 'root'}")
    return carry_out(plan, lay, dry_run=args.dry_run)


def uninstall(args: argparse.Namespace) -> int:
    lay = Layout(Path(args.root).absolute())
    if lay.root == Path("/") and os.geteuid() != 0 and not args.dry_run:
        print("mesh agent uninstall: run it as root (or --dry-run)", file=sys.stderr)
        return EXIT_USAGE
    plan = uninstall_plan(lay, purge=args.purge)
    code = carry_out(plan, lay, dry_run=args.dry_run)
    if not args.purge:
        print(f"kept {lay.data_dir} (tasks' logs and the task store): --purge removes it")
    print(
        "tasks the agent left running keep running (KillMode=process): kill their jobs "
        "before uninstalling, or stop them by hand"
    )
    return code


def run(args: argparse.Namespace, ctx: Context) -> int:
    if args.agent_cmd == "install":
        return install(args, ctx)
    return uninstall(args)
