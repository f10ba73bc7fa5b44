"""The commands the docs show are commands the code accepts as written: every `mesh ...`
line in the sh blocks of README.md, docs/ and the package READMEs parses, and every
nats-server flag docs/install.md uses is one the packaged nats-server has. (The
deployment itself is run, as docs/install.md says, by
tests/integration/test_deploy_as_documented.py.)"""

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
EVERY_DOC = [
    ROOT / "README.md",
    *sorted((ROOT / "docs").glob("*.md")),
    *sorted(ROOT.glob("*/README.md")),
]


def commands(path: Path, program: str) -> list[list[str]]:
    out = []
    for block in re.findall(r"```sh\n(.*?)```", path.read_text(), re.S):
        for line in block.splitlines():
            line = line.removeprefix(".venv/bin/")
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


def test_the_main_docs_show_mesh_commands():
    for doc in (ROOT / "README.md", *DOCS):
        assert commands(doc, "mesh"), doc


@pytest.mark.parametrize("doc", EVERY_DOC, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_mesh_command_parses(doc, capsys):
    found = commands(doc, "mesh")
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
