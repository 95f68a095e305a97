"""Write `agio.protoset`: the agio.v1 contract as one FileDescriptorSet, for tools that take one
instead of server reflection or .proto files (`grpcurl -protoset`, `ghz --protoset`).

Built by `buf build` from proto/, so it holds the contract as written, comments included
(grpcurl shows them in `describe`), and every file it imports (google/protobuf/*.proto): a set
missing an import is refused by the tools, so the script checks for that before it reports.

Run with `uv run python scripts/protoset.py` (`make protoset`); `--output PATH` writes elsewhere.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from google.protobuf import descriptor_pb2

ROOT = Path(__file__).resolve().parent.parent
BUF = Path(sys.executable).parent / "buf"
DEFAULT_OUTPUT = ROOT / "agio.protoset"


def build_protoset(output: Path) -> descriptor_pb2.FileDescriptorSet:
    """`buf build` proto/ into `output` as a plain FileDescriptorSet (imports included)."""
    command: list[str | Path] = [BUF, "build", "--as-file-descriptor-set", "--output", output]
    subprocess.run(command, check=True, cwd=ROOT)
    return descriptor_pb2.FileDescriptorSet.FromString(output.read_bytes())


def missing_imports(protoset: descriptor_pb2.FileDescriptorSet) -> list[str]:
    """Files imported by a file of the set that the set does not hold."""
    held = {file.name for file in protoset.file}
    return sorted({dep for file in protoset.file for dep in file.dependency} - held)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT, help="where to write")
    args = parser.parse_args()
    protoset = build_protoset(args.output.resolve())
    missing = missing_imports(protoset)
    if missing:
        print(f"{args.output} lacks imported files:", *missing)
        return 1
    services = [
        f"{file.package}.{service.name}" for file in protoset.file for service in file.service
    ]
    print(f"wrote {args.output}: {len(protoset.file)} files, services {', '.join(services)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
