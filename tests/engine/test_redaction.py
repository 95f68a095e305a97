"""Credentials out of what a model provider says: the redaction rules on tricky text, and the
model driver redacting every failed attempt's text (an error answer, an in-band error, a
malformed chunk, a retry, a restart) against the fake model and raw HTTP answers."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agio_grpc.engine.models import (
    ModelError,
    ModelReply,
    ModelRequest,
    ModelRestart,
    ModelRetry,
)
from agio_grpc.engine.models.openai_chat import OpenAIModelDriver
from agio_grpc.engine.models.openai_chunks import error_message
from agio_grpc.engine.models.redaction import (
    MIN_KEY_CHARS,
    REDACTED,
    Redactor,
    looks_like_a_credential,
)
from agio_grpc.testing import FakeModelServer, Turn
from tests.engine.harness import FAST_RETRIES
from tests.engine.test_model import RawHttpServer, Recorder

KEY = "proxy-key/7c1e0b5f2a9d"
"""The configured key: of no known shape, so only its value can find it; with a `/`, which
JSON may escape."""
BEARER = "sk-proj-Zq3vN8xR2mK7pL4tW9yB6cD1fH5jG0sA"
"""Another key a proxy echoes as the bearer token it was sent."""
ECHO = f"Incorrect API key provided: Bearer {BEARER}. Key on record: {KEY}."
HELLO = ModelRequest(model="fake-model", messages=[{"role": "user", "content": "hello"}])
redact = Redactor(KEY).redact


def assert_no_secret(text: str) -> None:
    assert KEY not in text
    assert BEARER not in text
    assert BEARER[: MIN_KEY_CHARS + 4] not in text  # nor any telling part of it
    assert KEY[:MIN_KEY_CHARS] not in text


# -- the configured key ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "echoed",
    [
        KEY,
        json.dumps(KEY),  # quoted
        KEY.replace("/", "\\/"),  # JSON's optional escape of `/`
        KEY.replace("/", "\\\\\\/"),  # escaped again, inside an escaped string
        KEY.replace("-", "\\u002d"),  # JSON's \u escape, as a PHP encoder may send it
        KEY.replace("-", "\\u002D").replace("e", "\\u0065"),  # upper-case hex, several chars
        KEY.replace("/", "%2F"),  # percent-encoded, as in a URL
        "".join(f"%{byte:02x}" for byte in KEY.encode()),  # every byte of it
    ],
)
def test_the_configured_key_is_redacted_in_every_form_it_is_echoed_in(echoed: str) -> None:
    redacted = redact(f"the key {echoed} is not valid")
    assert redacted.startswith("the key ")
    assert redacted.endswith(" is not valid")
    assert REDACTED in redacted
    assert "7c1e0b5f2a9d" not in redacted


@pytest.mark.parametrize("kept", [MIN_KEY_CHARS, MIN_KEY_CHARS + 5, len(KEY) - 1])
def test_a_key_cut_short_by_the_end_of_the_text_is_redacted_as_far_as_it_goes(kept: int) -> None:
    assert redact(f"HTTP 401: bad key {KEY[:kept]}") == f"HTTP 401: bad key {REDACTED}"
    # A quoted excerpt cut short (`data[:200]!r`): the closing quote follows the cut.
    assert redact(f"chunk: 'bad key {KEY[:kept]}'") == f"chunk: 'bad key {REDACTED}'"


def test_a_prefix_of_the_key_inside_the_text_is_not_the_key() -> None:
    # Only the end of a text is where a key is cut short; elsewhere a prefix is other words.
    text = f"{KEY[: MIN_KEY_CHARS + 2]} is another thing"
    assert redact(text) == text
    assert redact(f"{KEY[: MIN_KEY_CHARS - 1]}") == KEY[: MIN_KEY_CHARS - 1]


def test_a_key_shorter_than_the_minimum_is_not_looked_for() -> None:
    # A 3-character key would take every "abc" out of every message.
    assert Redactor("abc").redact("abcdef abc cab") == "abcdef abc cab"
    short = "k" * (MIN_KEY_CHARS - 1)
    assert Redactor(short).redact(f"got {short}") == f"got {short}"
    least = "Qx7-Pw2z"
    assert len(least) == MIN_KEY_CHARS
    assert Redactor(least).redact(f"got {least}!") == f"got {REDACTED}!"
    assert Redactor("").redact("anything") == "anything"


def test_every_occurrence_of_the_key_is_redacted_and_the_text_between_kept() -> None:
    text = f"{KEY}{KEY} and {KEY[:5]}x and {json.dumps({'key': KEY})}"
    assert redact(text) == f'{REDACTED}{REDACTED} and {KEY[:5]}x and {{"key": "{REDACTED}"}}'


# -- credential shapes -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "redacted"),
    [
        (f"provided: Bearer {BEARER}.", f"provided: Bearer {REDACTED}."),
        ("authorization: bearer abc.DEF-123_x~y+z/w==", f"authorization: bearer {REDACTED}"),
        ("header Basic dXNlcjpwYXNzd29yZA==", f"header Basic {REDACTED}"),
        (
            "Authorization: Token 9944b09199c62bcf9418ad846dd0e4bbdfc6ee4b",
            "Authorization: Token " + REDACTED,
        ),
        ('"authorization": "Zm9vYmFyMTIz" refused', f'"authorization": "{REDACTED}" refused'),
        ("Proxy-Authorization: Basic dXNlcjpwYXNz", f"Proxy-Authorization: Basic {REDACTED}"),
    ],
)
def test_credentials_after_an_auth_scheme_are_redacted(text: str, redacted: str) -> None:
    assert redact(text) == redacted


@pytest.mark.parametrize(
    "prose",
    [
        "Bearer authentication is required for this endpoint.",
        "Basic Authentication failed",
        "the bearer token is missing",
        "Missing Authorization: required header",
        "Authorization: Bearer <token>",
        "Bearer [REDACTED]",
    ],
)
def test_prose_after_an_auth_scheme_is_left(prose: str) -> None:
    assert redact(prose) == prose


@pytest.mark.parametrize(
    "secret",
    [
        BEARER,
        "sk-ant-api03-Zq3vN8xR2mK7pL4tW9yB6cD1fH5jG0sA-AAAA",
        "sk-or-v1-0123456789abcdef0123456789abcdef",
        "sk_live_51H8x2eZvKYlo2C0123456789",
        "gsk_Zq3vN8xR2mK7pL4tW9yB6cD1fH5jG0sA",
        "xai-Zq3vN8xR2mK7pL4tW9yB6cD1fH5jG0sA",
        "hf_ZqvNxRmKpLtWyBcDfHjGsAaaaa",
        "AIzaSyA-1234567890abcdefghijklmnopqrstu",
        "AKIAIOSFODNN7EXAMPLE",
        "ghp_0123456789abcdefghijABCDEFGHIJ012345",
        "github_pat_11ABCDEFG0123456789_abcdefghijklmnop",
        "xoxb-123456789012-1234567890123-AbCdEfGhIjKlMnOpQrStUvWx",
        "agio_f60297a7456c_qqsxSEaV4vxrVDQl0czphwYB_FuV7sTfWyGOQm2hjBM",
        "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQ",
    ],
)
def test_keys_of_known_shapes_and_jwts_are_redacted(secret: str) -> None:
    assert redact(f"rejected ({secret}).") == f"rejected ({REDACTED})."


@pytest.mark.parametrize(
    ("text", "redacted"),
    [
        ("GET /v1/models?key=Zq3vN8xR2m&alt=sse", f"GET /v1/models?key={REDACTED}&alt=sse"),
        ("url /v1?a=1&sig=abc%2Fdef; next", f"url /v1?a=1&sig={REDACTED}; next"),
        ("api_key=hunter2 is wrong", f"api_key={REDACTED} is wrong"),
        ("X-Api-Key=hunter2", f"X-Api-Key={REDACTED}"),
        ("access_token=abc&x=1", f"access_token={REDACTED}&x=1"),
        ("password=hunter2, user=bob", f"password={REDACTED}, user=bob"),
        (
            '{"client_secret": "abc\\"def", "model": "x"}',
            f'{{"client_secret": "{REDACTED}", "model": "x"}}',
        ),
        ('{"apiKey":"hunter2"}', f'{{"apiKey":"{REDACTED}"}}'),
        (
            "via https://user:hunter2@proxy.local:8080/ failed",
            f"via https://user:{REDACTED}@proxy.local:8080/ failed",
        ),
    ],
)
def test_credential_parameters_fields_and_url_passwords_are_redacted(
    text: str, redacted: str
) -> None:
    assert redact(text) == redacted


@pytest.mark.parametrize(
    "ordinary",
    [
        "HTTP 401: Incorrect API key provided (invalid_api_key)",
        "Rate limit reached for gpt-4o in organization org-abc on tokens per min (TPM): "
        "Limit 30000, Used 29823, Requested 1200. Please try again in 2.046s.",
        "This model's maximum context length is 8192 tokens. However, your messages resulted "
        "in 9000 tokens. Please reduce the length of the messages.",
        "the model stream reported an error (server_error): The server had an error",
        "model call failed after 3 retries: HTTP 503: upstream connect error",
        "a key=value pair, max_tokens=5 and a task-sk-like word",
        "param 'api_key' must be a string; see https://platform.openai.com/docs/api-keys",
        "model_not_found: The model `gpt-5-turbo-2025-preview` does not exist",
        "ClientConnectorError: Cannot connect to host 127.0.0.1:9 ssl:default",
        "",
    ],
)
def test_ordinary_error_text_is_left_whole(ordinary: str) -> None:
    assert redact(ordinary) == ordinary


def test_looks_like_a_credential_tells_tokens_from_words() -> None:
    assert looks_like_a_credential("dXNlcjpwYXNz")
    assert looks_like_a_credential("abcdef12")
    assert looks_like_a_credential("abc-defgh")
    assert not looks_like_a_credential("authentication")
    assert not looks_like_a_credential("Authentication")
    assert not looks_like_a_credential("ab12")  # too short


# -- any text ----------------------------------------------------------------------------------


def test_nul_and_lone_surrogates_around_the_key_are_kept_and_the_key_is_not() -> None:
    text = f"\x00{KEY}\x00 Bearer {BEARER}\udcff\ud800 tail"
    assert redact(text) == f"\x00{REDACTED}\x00 Bearer {REDACTED}\udcff\ud800 tail"


def test_undecodable_bytes_around_the_key_are_kept_and_the_key_is_not() -> None:
    body = b"\xff\xfe bad key " + KEY.encode() + b" \xc3\x28 Bearer " + BEARER.encode()
    for text in (body.decode(errors="surrogateescape"), body.decode(errors="replace")):
        redacted = redact(text)
        assert_no_secret(redacted)
        assert redacted.count(REDACTED) == 2
    # As the driver reads an error answer's body that is not JSON.
    assert_no_secret(redact(error_message(body)))


def test_a_json_body_that_cannot_be_decoded_is_redacted_in_its_escaped_form() -> None:
    # Invalid UTF-8 makes the body text, not JSON: the key keeps its escapes (`\/`).
    escaped = KEY.replace("/", "\\/").encode()
    body = b'{"error": {"message": "bad key ' + escaped + b' \xff"}}'
    text = error_message(body)
    assert "\\/" in text
    assert_no_secret(redact(text))


@given(st.text(), st.text())
def test_the_key_anywhere_in_any_text_is_redacted(before: str, after: str) -> None:
    assert KEY not in redact(before + KEY + after)


@given(st.text())
def test_redacting_twice_changes_nothing_more(text: str) -> None:
    once = redact(text + " Bearer " + BEARER + " " + KEY[:10])
    assert redact(once) == once


@given(st.text(alphabet="abcdefghijklmnopqrstuvwxyz .,:;!?()'\n"))
def test_lower_case_prose_is_never_changed(prose: str) -> None:
    assert redact(prose) == prose


# -- the model driver --------------------------------------------------------------------------


async def complete(base_url: str) -> tuple[ModelReply, Recorder]:
    driver = OpenAIModelDriver(base_url=base_url, api_key=KEY, retry=FAST_RETRIES)
    recorder = Recorder()
    try:
        return await driver.complete(HELLO, recorder), recorder
    finally:
        await driver.close()


async def test_an_error_answer_echoing_the_credentials_fails_without_them(
    fake_model: FakeModelServer,
) -> None:
    fake_model.enqueue(Turn.error(401, message=ECHO))
    with pytest.raises(ModelError) as raised:
        await complete(fake_model.base_url)
    error = raised.value
    assert error.message == (
        f"HTTP 401: Incorrect API key provided: Bearer {REDACTED}. Key on record: {REDACTED}."
    )
    assert (error.status_code, error.error_code, error.retryable) == (401, "invalid_api_key", False)
    # Nor does any exception it was raised from, or while handling.
    linked: BaseException | None = error
    while linked is not None:
        assert_no_secret(str(linked))
        linked = linked.__cause__ or linked.__context__


async def test_retry_notices_and_the_final_error_carry_no_credentials(
    fake_model: FakeModelServer,
) -> None:
    fake_model.enqueue(*[Turn.error(429, retry_after=0, message=ECHO)] * 2, Turn.text("ok"))
    reply, recorder = await complete(fake_model.base_url)
    assert reply.content == "ok"
    retries = recorder.of(ModelRetry)
    assert len(retries) == 2
    for retry in retries:
        assert retry.message.startswith("HTTP 429: Incorrect API key provided: Bearer ")
        assert_no_secret(retry.message)
    fake_model.enqueue(*[Turn.error(503, message=ECHO)] * (FAST_RETRIES.max_retries + 1))
    with pytest.raises(ModelError) as raised:
        await complete(fake_model.base_url)
    assert raised.value.message.startswith("model call failed after 3 retries: HTTP 503: ")
    assert_no_secret(raised.value.message)


async def test_an_in_band_error_echoing_the_credentials_keeps_its_code_only(
    fake_model: FakeModelServer,
) -> None:
    error = {"message": ECHO, "type": "invalid_request_error", "code": "invalid_api_key"}
    fake_model.enqueue(Turn.raw(json.dumps({"error": error})))
    with pytest.raises(ModelError) as raised:
        await complete(fake_model.base_url)
    assert raised.value.message.startswith(
        "the model stream reported an error (invalid_api_key): Incorrect API key provided: "
    )
    assert raised.value.error_code == "invalid_api_key"
    assert_no_secret(raised.value.message)


async def test_a_restart_notice_after_deltas_carries_no_credentials(
    fake_model: FakeModelServer,
) -> None:
    partial = {"choices": [{"index": 0, "delta": {"content": "partial"}}]}
    error = {"error": {"message": ECHO, "type": "server_error", "code": None}}
    fake_model.enqueue(Turn.raw(json.dumps(partial), json.dumps(error)), Turn.text("whole"))
    _, recorder = await complete(fake_model.base_url)
    (restart,) = recorder.of(ModelRestart)
    assert restart.message.startswith("the model stream reported an error (server_error): ")
    assert_no_secret(restart.message)


async def test_a_malformed_chunk_quoting_a_key_cut_short_carries_none_of_it(
    fake_model: FakeModelServer,
) -> None:
    # The excerpt quoted is the chunk's first 200 characters: the key is cut at the 10th.
    chunk = "x" * 190 + KEY + " and more"
    fake_model.enqueue(*[Turn.raw(chunk)] * (FAST_RETRIES.max_retries + 1))
    with pytest.raises(ModelError) as raised:
        await complete(fake_model.base_url)
    assert raised.value.message.endswith(f"{'x' * 190}{REDACTED}'")
    assert KEY[:MIN_KEY_CHARS] not in raised.value.message


async def test_an_error_body_of_undecodable_bytes_is_redacted() -> None:
    text = b"\xff upstream refused key " + KEY.encode() + b"\x00 Bearer " + BEARER.encode()
    head = f"HTTP/1.1 401 Unauthorized\r\nconnection: close\r\ncontent-length: {len(text)}"
    async with RawHttpServer(f"{head}\r\n\r\n".encode() + text) as base_url:
        with pytest.raises(ModelError) as raised:
            await complete(base_url)
    assert raised.value.message.startswith("HTTP 401: \ufffd upstream refused key [REDACTED]")
    assert_no_secret(raised.value.message)
