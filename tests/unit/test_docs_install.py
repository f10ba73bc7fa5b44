"""The commands docs/install.md and docs/security.md show are commands the code accepts
as written: every `mesh ...` line in their sh blocks parses, and every nats-server flag
they use is one the packaged nats-server has. (The deployment itself is run by
tests/integration/test_agent_install.py.)"""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

import pytest

from mesh.cli.parser import build_parser
from mesh.server import find_server_binary

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "docs" / "install.md", ROOT / "docs" / "security.md"]


def commands(path: Path, program: str) -> list[list[str]]:
    out = []
    for block in re.findall(r"```sh\n(.*?)```", path.read_text(), re.S):
        for line in block.splitlines():
            if line.startswith(program + " "):
                out.append(shlex.split(line, comments=True))
    return out


def test_docs_show_the_deployment_commands():
    install = [" ".join(c) for c in commands(DOCS[0], "mesh")]
    for needed in (
        "mesh certs init",
        "mesh certs nats-conf",
        "--reload",
        "mesh certs bundle",
        "mesh agent install",
        "mesh agent uninstall",
        " coordinator ",
    ):
        assert any(needed in c for c in install), needed


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_mesh_command_parses(doc, capsys):
    found = commands(doc, "mesh")
    assert found
    for argv in found:
        try:
            build_parser().parse_args(argv[1:])
        except SystemExit:
            pytest.fail(f"{doc.name}: `{shlex.join(argv)}` is refused: {capsys.readouterr().err}")


def test_nats_server_flags_exist():
    help_text = subprocess.run(
        [find_server_binary(), "--help"], capture_output=True, text=True, timeout=30
    )
    text = help_text.stdout + help_text.stderr
    found = commands(DOCS[0], "nats-server")
    assert found
    for argv in found:
        for arg in argv[1:]:
            if arg.startswith("-"):
                assert re.search(rf"(^|[\s,]){re.escape(arg.split('=')[0])}\b", text), arg
    doc = DOCS[0].read_text() + DOCS[1].read_text()
    assert "nats-server --signal reload=" in doc and "<pid> can be either a PID" in text
