"""`make bench` / `python -m bench`: run every benchmark and print their tables."""

from __future__ import annotations

import sys

from bench import streaming


def main(argv: list[str] | None = None) -> int:
    return streaming.main(sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    raise SystemExit(main())
