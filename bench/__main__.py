"""`python -m bench <name> [args]`: run one benchmark.

Each benchmark is a module `bench/<name>.py` with `main(argv: list[str]) -> dict`;
it prints what it likes, and this runner prints the returned dict last, as one
JSON line, so scripts can read the final line.
"""

from __future__ import annotations

import importlib
import json
import pkgutil
import sys

import bench


def available() -> list[str]:
    return sorted(
        m.name for m in pkgutil.iter_modules(bench.__path__) if not m.name.startswith("_")
    )


def main(argv: list[str]) -> int:
    names = available()
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: python -m bench <name> [args]\nbenchmarks: " + ", ".join(names))
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in names:
        print(f"unknown benchmark {name!r}; available: {', '.join(names)}", file=sys.stderr)
        return 2
    result = importlib.import_module(f"bench.{name}").main(rest)
    print(json.dumps({"bench": name, **result}, sort_keys=True), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
