"""The MCP reference servers (npm packages of modelcontextprotocol/servers) for the tests,
pinned by tests/mcp/reference/package-lock.json and installed with `npm ci` into
.tools/mcp-reference the first time a test asks for one (then reused while the lock is
unchanged; a file lock keeps pytest-xdist workers from installing at once).

Without npm or node the tests that need them skip, unless the run is CI (`CI` set, or
`AGIO_REQUIRE_MCP_REFERENCE=1`, which .ci/run sets): then they fail. A failed install always
fails.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PINNED = Path(__file__).parent / "reference"
PREFIX = ROOT / ".tools" / "mcp-reference"
ENV_REQUIRE = "AGIO_REQUIRE_MCP_REFERENCE"
LOCK_FILE = "package-lock.json"
INSTALLED_MARK = "installed-package-lock.json"
"""A copy of the lock `npm ci` last installed completely."""


@dataclass(frozen=True)
class ReferenceServers:
    """Where the installed reference servers are."""

    prefix: Path
    """The npm prefix: `npx --prefix PREFIX mcp-server-everything` finds its bin there."""

    @property
    def everything(self) -> Path:
        """server-everything's entry point: `node EVERYTHING stdio` serves over stdio."""
        return self.prefix / "node_modules/@modelcontextprotocol/server-everything/dist/index.js"


def required() -> bool:
    """Whether a missing npm must fail the tests rather than skip them (CI)."""
    return bool(os.environ.get("CI")) or os.environ.get(ENV_REQUIRE) == "1"


def install_reference_servers() -> ReferenceServers:
    """The pinned reference servers, installed first when missing or out of date."""
    servers = ReferenceServers(PREFIX)
    PREFIX.mkdir(parents=True, exist_ok=True)
    with (PREFIX.parent / "mcp-reference.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _installed() and servers.everything.is_file():
            return servers
        missing = [program for program in ("npm", "node") if shutil.which(program) is None]
        if missing:
            reason = f"{' and '.join(missing)} not on PATH: the MCP reference servers need them"
            if required():
                pytest.fail(f"{reason} (required in CI: {ENV_REQUIRE}=1 or CI is set)")
            pytest.skip(reason)
        (PREFIX / INSTALLED_MARK).unlink(missing_ok=True)
        for name in ("package.json", LOCK_FILE):
            shutil.copyfile(PINNED / name, PREFIX / name)
        installed = subprocess.run(
            ["npm", "ci", "--no-audit", "--no-fund"],
            cwd=PREFIX,
            capture_output=True,
            text=True,
            timeout=600,
        )
        if installed.returncode != 0:
            pytest.fail(f"npm ci of the MCP reference servers failed:\n{installed.stderr[-2000:]}")
        shutil.copyfile(PINNED / LOCK_FILE, PREFIX / INSTALLED_MARK)
    return servers


def _installed() -> bool:
    mark = PREFIX / INSTALLED_MARK
    return mark.is_file() and mark.read_bytes() == (PINNED / LOCK_FILE).read_bytes()
