"""Fetch tiktoken's encodings into a cache folder, so that token counts need no network.

    python scripts/tokenizers.py [FOLDER]      (default .tools/tiktoken; `make tokenizers`)

Each encoding of engine/tokens.py (`o200k_base`, `cl100k_base`) is written under the name
tiktoken looks for (the SHA-1 of its URL), once its SHA-256 is the one tiktoken checks. It
comes from OpenAI's URL, else from the JTokkit jar on Maven Central, which ships the same
files (same SHA-256). An encoding already there is kept. Exits 1 naming what it could not
fetch; the service then estimates token counts from characters (docs/compaction.md).
"""

from __future__ import annotations

import hashlib
import io
import sys
import urllib.request
import zipfile
from pathlib import Path

from agio_grpc.engine.tokens import ENCODING_FILES

JTOKKIT_JAR = "https://repo1.maven.org/maven2/com/knuddels/jtokkit/1.1.0/jtokkit-1.1.0.jar"
TIMEOUT_S = 30


def fetch(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=TIMEOUT_S) as response:
        data: bytes = response.read()
        return data


def from_jar(jar: bytes, name: str) -> bytes:
    with zipfile.ZipFile(io.BytesIO(jar)) as archive:
        return archive.read(f"com/knuddels/jtokkit/{name}.tiktoken")


def main() -> int:
    folder = Path(sys.argv[1] if len(sys.argv) > 1 else ".tools/tiktoken")
    folder.mkdir(parents=True, exist_ok=True)
    jar: bytes | None = None
    missing: list[str] = []
    for name, file in ENCODING_FILES.items():
        target = folder / file.cache_name
        if target.is_file() and hashlib.sha256(target.read_bytes()).hexdigest() == file.sha256:
            continue
        data = b""
        try:
            data = fetch(file.url)
        except OSError as error:
            print(
                f"{name}: {file.url} unreachable ({error}); trying Maven Central", file=sys.stderr
            )
        if hashlib.sha256(data).hexdigest() != file.sha256:
            try:
                jar = jar if jar is not None else fetch(JTOKKIT_JAR)
                data = from_jar(jar, name)
            except (OSError, KeyError, zipfile.BadZipFile) as error:
                print(f"{name}: {JTOKKIT_JAR} failed too ({error})", file=sys.stderr)
        if hashlib.sha256(data).hexdigest() != file.sha256:
            missing.append(name)
            continue
        partial = target.with_suffix(".partial")
        partial.write_bytes(data)
        partial.replace(target)
        print(f"{name}: {target}")
    if missing:
        print(f"not fetched: {', '.join(missing)} (token counts are estimated)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
