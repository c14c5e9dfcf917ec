"""``python -m benchmarks NAME [ARGS...]``: run one study; without a name, list them."""

from __future__ import annotations

import sys

from benchmarks import names, run


def main(argv: list[str]) -> int:
    if not argv or argv[0].startswith("-"):
        print("usage: python -m benchmarks NAME [ARGS...]\nstudies: " + ", ".join(names()))
        return 0 if argv[:1] in (["-h"], ["--help"]) else 2
    return run(argv[0], argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
