"""The command a pytorch job's workers give, as torchrun runs it: checked when the spec
is parsed (a command Mesh cannot run under torchrun is refused at submit, naming the
field) and used by the torch adapter (workloads/frameworks/torch.py) to build its argv.
Its own module because the spec cannot import the adapters (they import the spec)."""

from __future__ import annotations

import os
import re

from workloads.quantity import SpecError

_PYTHON = re.compile(r"python(\d+(\.\d+)*)?")


def torchrun_command(command: tuple[str, ...]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(launcher, target): ``launcher + flags + target`` runs ``command`` under torchrun.

    Accepted: ``python[3[.X]] [-u] script.py args`` and ``python -m module args`` (any
    path to a Python interpreter: that one runs torchrun and the workers; ``-u`` is
    dropped, torchrun passes it), ``script.py args`` (run by ``python``), and any other
    program (``--no-python``: torchrun runs it as is, a ``/bin/sh -c`` string included).
    Refused: torchrun itself (Mesh runs it) and other interpreter options.
    """
    if not command:
        raise SpecError("command", "a pytorch job needs a command: the training script")
    head, rest = command[0], list(command[1:])
    base = os.path.basename(head)
    if base == "torchrun" or tuple(rest[:2]) == ("-m", "torch.distributed.run"):
        raise SpecError("command", "give the training script and its arguments; Mesh runs torchrun")
    if _PYTHON.fullmatch(base):
        while rest[:1] == ["-u"]:
            rest.pop(0)
        if rest[:1] == ["-m"] and len(rest) >= 2:
            return (head, "-m", "torch.distributed.run"), ("--module", *rest[1:])
        if not rest or rest[0].startswith("-"):
            raise SpecError(
                "command",
                f"expected {base} [-u] SCRIPT ARGS or {base} -m MODULE ARGS, got "
                f"{' '.join(command)[:200]!r}",
            )
        return (head, "-m", "torch.distributed.run"), tuple(rest)
    if base.endswith(".py"):
        return ("python", "-m", "torch.distributed.run"), command
    return ("python", "-m", "torch.distributed.run"), ("--no-python", *command)
