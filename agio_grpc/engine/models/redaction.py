"""Credentials taken out of what a model provider says, before the engine keeps or shows it.

A provider's error text can quote the request's credential: a proxy answering 401 with
`Incorrect API key provided: Bearer sk-...`, a gateway echoing the URL with its `?key=...`.
The adapter passes the text of every failed attempt (an error answer's body, an error object
inside the stream, a transport error) through `Redactor.redact` at the one place it becomes
the engine's (`ModelError`, `ModelRetry`, `ModelRestart`), so a stop signal, the store, the
journal, spans and logs never hold it. Each credential becomes `[REDACTED]`; the words around
it (the HTTP status, the provider's error code, what was wrong) stay.

What is a credential:
- the configured API key, wherever it appears: as sent, JSON-escaped (`\\/`, `\\u002d`, escaped
  again inside a quoted string) or percent-encoded, and a prefix of it of at least
  `MIN_KEY_CHARS` that ends the text (a message cut short inside the key). A key shorter than
  `MIN_KEY_CHARS` is not looked for: so short a value is part of ordinary words (a key `abc`
  would take every "abc" out of every message) and no secret worth the name;
- the credential after `Bearer` or `Basic`, and the value of an `Authorization` header or
  field, when it looks like one (`looks_like_a_credential`): prose (`Bearer authentication
  required`) stays;
- keys of the shapes providers and code hosts issue: `sk-`, `sk_`, `gsk_`, `xai-`, `pplx-`,
  `hf_`, `r8_`, `fw_`, `nvapi-`, `csk-`, `ghp_`, `github_pat_`, `glpat-`, `xox?-`, `agio_` (the
  server's own) and `AIza` followed by 16 or more key characters, and AWS access key ids;
- JSON Web Tokens (`eyJ...` with two or more dots);
- the value of a parameter or JSON field named for a credential (`api_key=`, `access_token=`,
  `"client_secret": "..."`; the looser `key=`, `sig=`, `auth=` only in a query string, after
  `?`, `&` or `;`), and the password of a URL (`https://user:...@host`).

`redact` takes any text (NUL, lone surrogates from undecodable bytes) and returns it with only
the credentials replaced; redacting twice changes nothing more. Never imports a transport or
an adapter.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Final

REDACTED: Final = "[REDACTED]"
MIN_KEY_CHARS: Final = 8
"""A configured key shorter than this is not looked for by its value (see above)."""
MIN_CREDENTIAL_CHARS: Final = 8
"""The shortest word after `Bearer`, `Basic` or `Authorization:` taken for a credential."""

# A bearer token (RFC 6750's b64token; not ending in a sentence's dot), and the characters of
# a key and of a JWT's parts.
_TOKEN = r"[A-Za-z0-9\-._~+/]*[A-Za-z0-9\-_~+/]=*"
_KEY_CHARS = r"[A-Za-z0-9_\-]"
_SYMBOLS = frozenset("-_~+/=")

_AUTH_SCHEME = re.compile(rf"(?i)\b(bearer|basic)(\s+)({_TOKEN})")
# The value of an Authorization header or field: a credential, or a scheme and a credential.
_AUTHORIZATION = re.compile(
    rf"(?i)\b((?:proxy-)?authorization[\"']?\s*[:=]\s*[\"']?)({_TOKEN})(?:(\s+)({_TOKEN}))?"
)
_KEY_PREFIXES = (
    "sk-",
    "sk_",
    "gsk_",
    "xai-",
    "pplx-",
    "hf_",
    "r8_",
    "fw_",
    "nvapi-",
    "csk-",
    "ghp_",
    "gho_",
    "ghu_",
    "ghs_",
    "github_pat_",
    "glpat-",
    "AIza",
)
_SHAPED_KEY = re.compile(
    r"\b(?:"
    + "|".join(re.escape(prefix) for prefix in _KEY_PREFIXES)
    + rf"|xox[abprs]-){_KEY_CHARS}{{16,}}"
    + r"|\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"
    + rf"|\bagio_[0-9a-f]{{12}}_{_KEY_CHARS}{{16,}}"  # this server's own (store/keys.py)
)
# A JWS has three parts, a JWE five; a sentence's closing dot is not a part.
_JWT = re.compile(
    rf"\beyJ{_KEY_CHARS}{{4,}}\.{_KEY_CHARS}*\.{_KEY_CHARS}*(?:\.{_KEY_CHARS}+){{0,2}}"
)
_CREDENTIAL_NAMES = (
    r"(?:x-)?api[_\-]?key|(?:access|refresh|id|auth)[_\-]?token|token"
    r"|client[_\-]?secret|secret[_\-]?key|private[_\-]?key|secret|password|passwd"
)
# Up to the next separator; never from `[`, so `[REDACTED]` is not redacted again.
_VALUE = r"[^\s&\"'<>#,;()\[\]{}]+"
_NAMED_VALUE = re.compile(
    rf"(?i)(\b(?:{_CREDENTIAL_NAMES})=|[?&;](?:key|sig|signature|auth)=)({_VALUE})"
)
_JSON_FIELD = re.compile(
    rf"(?i)(\"(?:{_CREDENTIAL_NAMES}|authorization)\"\s*:\s*\")((?:[^\"\\]|\\.)+)(\")"
)
_URL_PASSWORD = re.compile(r"(?i)\b([a-z][a-z0-9+.\-]*://[^/\s:@]+:)([^/\s@]+)(@)")
_CLOSING_QUOTES = "'\""


def looks_like_a_credential(word: str) -> bool:
    """Whether the word after `Bearer`, `Basic` or `Authorization:` is a credential rather
    than prose: `MIN_CREDENTIAL_CHARS` or longer, with a digit, a symbol (`-_~+/=`) or a
    capital after its first letter (a random token has one; `authentication` has none)."""
    if len(word) < MIN_CREDENTIAL_CHARS:
        return False
    return any(char.isdigit() or char in _SYMBOLS for char in word) or any(
        char.isupper() for char in word[1:]
    )


class Redactor:
    """Redacts credentials from provider text; `api_key` is the configured key."""

    def __init__(self, api_key: str) -> None:
        self._key = _KeyMatcher(api_key) if len(api_key) >= MIN_KEY_CHARS else None

    def redact(self, text: str) -> str:
        """`text` with every credential in it replaced by `[REDACTED]`."""
        if self._key is not None:
            text = self._key.redact(text)
        text = _AUTHORIZATION.sub(_authorization, text)
        text = _AUTH_SCHEME.sub(_scheme_credential, text)
        text = _SHAPED_KEY.sub(REDACTED, text)
        text = _JWT.sub(REDACTED, text)
        text = _JSON_FIELD.sub(rf"\1{REDACTED}\3", text)
        text = _NAMED_VALUE.sub(rf"\1{REDACTED}", text)
        return _URL_PASSWORD.sub(rf"\1{REDACTED}\3", text)


def _scheme_credential(found: re.Match[str]) -> str:
    """`Bearer <credential>` with the credential redacted, when it looks like one."""
    scheme, space, credential = found.groups()
    if not looks_like_a_credential(credential):
        return found[0]
    return f"{scheme}{space}{REDACTED}"


def _authorization(found: re.Match[str]) -> str:
    """An Authorization value with its credential redacted: the first word when it looks
    like one (`Authorization: Zm9v...`), else the second (`Authorization: Token 9944...`)."""
    name, first, space, second = found.groups()
    if looks_like_a_credential(first):
        return f"{name}{REDACTED}{space or ''}{second or ''}"
    if second is not None and looks_like_a_credential(second):
        return f"{name}{first}{space}{REDACTED}"
    return found[0]


class _KeyMatcher:
    """Finds one key in text, in any of the forms a provider may echo it in.

    The key's first `MIN_KEY_CHARS` characters are found by one expression; from each place
    they are, the rest is followed a character at a time, so a key cut short by the end of the
    text is found as far as it goes (one expression with a nested optional group per
    character would overflow the parser's recursion for a long key).
    """

    def __init__(self, key: str) -> None:
        forms = [_char_forms(char) for char in key]
        self._start = re.compile("".join(forms[:MIN_KEY_CHARS]))
        self._rest = [re.compile(form) for form in forms[MIN_KEY_CHARS:]]

    def redact(self, text: str) -> str:
        parts: list[str] = []
        done = 0
        for start, end in self._spans(text):
            parts += (text[done:start], REDACTED)
            done = end
        return "".join(parts) + text[done:] if parts else text

    def _spans(self, text: str) -> Iterator[tuple[int, int]]:
        """Where the key is: whole, or cut short by the end of the text (a closing quote may
        follow, as around a quoted excerpt)."""
        cut_end = len(text.rstrip(_CLOSING_QUOTES))
        position = 0
        while (found := self._start.search(text, position)) is not None:
            end = self._follow(text, found.end())
            if end is None and found.end() <= cut_end and self._reaches(text, found.end(), cut_end):
                end = cut_end
            if end is None:
                position = found.start() + 1
                continue
            yield found.start(), end
            position = end

    def _follow(self, text: str, position: int) -> int | None:
        """The end of the whole key's rest from `position`, if it is there."""
        for form in self._rest:
            step = form.match(text, position)
            if step is None:
                return None
            position = step.end()
        return position

    def _reaches(self, text: str, position: int, end: int) -> bool:
        """Whether the key's rest, followed from `position`, runs to `end` and no further."""
        for form in self._rest:
            if position == end:
                return True
            step = form.match(text, position, end)
            if step is None:
                return False
            position = step.end()
        return position == end


def _char_forms(char: str) -> str:
    """An expression for one key character as sent, JSON-escaped (`\\u002d`; `\\/`, `\\"` and
    `\\\\` escaped any number of times over) or percent-encoded (its UTF-8 bytes).

    A run of backslashes is matched only from its start (`(?<!\\\\)`): tried from each of its
    backslashes, a text of nothing but backslashes would take time quadratic in its length.
    """
    forms = [re.escape(char)]
    if char in '/"\\':
        forms.append(r"(?<!\\)\\+" + re.escape(char))
    if ord(char) <= 0xFFFF:
        forms.append(rf"(?<!\\)\\+u(?i:{ord(char):04x})")
    forms.append("".join(f"%(?i:{byte:02x})" for byte in char.encode(errors="surrogatepass")))
    return f"(?:{'|'.join(forms)})"
