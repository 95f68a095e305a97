"""Counting a text's tokens for context-window accounting (engine/compaction.py).

For OpenAI's model families (gpt-4o, gpt-4.1, gpt-5, o1/o3/o4: `o200k_base`; gpt-4 and
gpt-3.5-turbo: `cl100k_base`) the count is tiktoken's, when the encoding's file is in
tiktoken's cache (`TIKTOKEN_CACHE_DIR`; `make tokenizers` fills `.tools/tiktoken`, which
`make serve` and `make test` use). The service never downloads it while serving: a run
must not wait on the network for an estimate. Without the file, and for every other model,
the count is a character estimate: an ASCII text is a token per 4 characters, any other text
a token per character (CJK scripts run near one token a character; accented Latin text is
overestimated, on the safe side).

Never imports grpc; reads files only when an encoding is first asked for.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class EncodingFile:
    """Where tiktoken downloads an encoding from, and the SHA-256 it checks it against."""

    url: str
    sha256: str

    @property
    def cache_name(self) -> str:
        """The file's name in tiktoken's cache (the SHA-1 of its URL)."""
        return hashlib.sha1(self.url.encode()).hexdigest()


ENCODING_FILES: Final[dict[str, EncodingFile]] = {
    "o200k_base": EncodingFile(
        "https://openaipublic.blob.core.windows.net/encodings/o200k_base.tiktoken",
        "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d",
    ),
    "cl100k_base": EncodingFile(
        "https://openaipublic.blob.core.windows.net/encodings/cl100k_base.tiktoken",
        "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7",
    ),
}

# OpenAI's families by model name prefix (the longest matching prefix wins).
_FAMILY_ENCODINGS: Final[dict[str, str]] = {
    "gpt-4o": "o200k_base",
    "gpt-4.1": "o200k_base",
    "gpt-4.5": "o200k_base",
    "gpt-5": "o200k_base",
    "o1": "o200k_base",
    "o3": "o200k_base",
    "o4": "o200k_base",
    "gpt-4": "cl100k_base",
    "gpt-3.5-turbo": "cl100k_base",
}

Counter = Callable[[str], int]
"""A text's tokens."""


def estimate_text_tokens(text: str) -> int:
    """A text's tokens, estimated from its characters (see the module docstring)."""
    if text.isascii():
        return math.ceil(len(text) / 4)
    return len(text)


def encoding_name(model: str) -> str | None:
    """The tiktoken encoding of `model`'s family (a provider prefix such as `openai/`
    ignored), or None for a model of another family."""
    name = model.rpartition("/")[2].lower()
    matches = [prefix for prefix in _FAMILY_ENCODINGS if name.startswith(prefix)]
    return _FAMILY_ENCODINGS[max(matches, key=len)] if matches else None


def tiktoken_cache_dir() -> Path:
    """Where tiktoken keeps encodings: `TIKTOKEN_CACHE_DIR`, `DATA_GYM_CACHE_DIR`, else
    its folder in the system's temporary directory."""
    for variable in ("TIKTOKEN_CACHE_DIR", "DATA_GYM_CACHE_DIR"):
        if value := os.environ.get(variable):
            return Path(value)
    return Path(tempfile.gettempdir()) / "data-gym-cache"


_counters: dict[str, Counter] = {}


def counter_for(model: str) -> tuple[str, Counter]:
    """The token counter for `model`, and its name (`o200k_base`, `cl100k_base` or
    `estimate`): tiktoken's when the encoding's file is cached, else the estimate."""
    encoding = encoding_name(model)
    if encoding is None:
        return "estimate", estimate_text_tokens
    counter = _counters.get(encoding)
    if counter is None:
        counter = _counters[encoding] = _load(encoding)
    return (encoding if counter is not estimate_text_tokens else "estimate"), counter


def _load(encoding: str) -> Counter:
    """tiktoken's count with `encoding`, read from the cache only; else the estimate."""
    file = ENCODING_FILES[encoding]
    cached = tiktoken_cache_dir() / file.cache_name
    if not cached.is_file():
        log.info(
            "tiktoken's %s is not in %s: token counts are estimated from characters "
            "(`make tokenizers` fetches it)",
            encoding,
            cached.parent,
        )
        return estimate_text_tokens
    # tiktoken would download the file again over one that does not match its hash.
    if hashlib.sha256(cached.read_bytes()).hexdigest() != file.sha256:
        log.warning("%s is not tiktoken's %s (its SHA-256 differs): estimating", cached, encoding)
        return estimate_text_tokens
    import tiktoken  # only here: about 0.1 s to import, and only for OpenAI's families

    try:
        # Reads the cached file (and checks its hash): nothing is downloaded.
        encoder = tiktoken.get_encoding(encoding)
    except (OSError, ValueError) as error:
        log.warning("tiktoken's %s could not be loaded (%s): estimating", encoding, error)
        return estimate_text_tokens

    def count(text: str) -> int:
        return len(encoder.encode_ordinary(text))

    return count
