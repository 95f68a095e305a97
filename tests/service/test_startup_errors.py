"""Start-up errors an operator can fix: one line each (what failed, which setting, how to fix
it), exit code 2, the traceback only with `--debug`."""

from __future__ import annotations

import asyncio
import os
import socket
import sys
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from agio_grpc.cli import main
from agio_grpc.cli.serve import configuration_lines
from agio_grpc.config import ServerConfig, Settings, model_key_warning
from agio_grpc.service.app import AgioApp
from agio_grpc.service.startup import StartupError, check_bindable
from tests.service.conftest import make_settings
from tests.store.versions import set_version

MODEL_URL = "http://127.0.0.1:9/v1"


async def start_fails(tmp_path: Path, **overrides: Any) -> StartupError:
    """The StartupError of an app started with `overrides` on top of the tests' settings."""
    database_url = overrides.pop("database_url", f"sqlite+aiosqlite:///{tmp_path / 'agio.db'}")
    settings = make_settings(database_url, MODEL_URL, **overrides)
    with pytest.raises(StartupError) as failed:
        await AgioApp.start(settings)
    return failed.value


@pytest.mark.parametrize(
    ("url", "what", "shown"),
    [
        ("nonsense://x", "bad database URL: unsupported database URL scheme", "nonsense://x"),
        (
            "postgresql+asyncpg://agio:hunter2@127.0.0.1:1/agio",
            "cannot connect to the database",
            "postgresql+asyncpg://agio:***@127.0.0.1:1/agio",
        ),
        (
            "sqlite+aiosqlite:////no/such/directory/agio.db",
            "cannot open the SQLite database: no directory /no/such/directory",
            "sqlite+aiosqlite:////no/such/directory/agio.db",
        ),
    ],
    ids=["bad-url", "unreachable-postgres", "no-directory"],
)
async def test_a_database_that_cannot_open_names_the_url_without_its_password(
    tmp_path: Path, url: str, what: str, shown: str
) -> None:
    error = await start_fails(tmp_path, database_url=url)
    assert str(error).startswith(what)
    assert error.setting == f"AGIO_DATABASE_URL={shown}"
    assert "hunter2" not in str(error)
    assert "\n" not in str(error)


async def test_a_database_a_newer_version_migrated_names_its_revision_and_the_fix(
    sqlite_url: str, tmp_path: Path
) -> None:
    await set_version(sqlite_url, "0099")

    error = await start_fails(tmp_path, database_url=sqlite_url)

    assert str(error).startswith("the database's schema is at revision '0099'")
    assert "run the version of agio-grpc that migrated it" in error.fix
    assert error.setting == f"AGIO_DATABASE_URL={sqlite_url}"


async def test_a_tool_module_that_cannot_be_imported_names_it(tmp_path: Path) -> None:
    error = await start_fails(tmp_path, tool_modules=["no_such_module_of_tools"])
    assert "cannot load the tools: cannot import 'no_such_module_of_tools'" in str(error)
    assert "AGIO_TOOL_MODULES" in error.setting


async def test_a_hook_that_cannot_be_imported_names_it(tmp_path: Path) -> None:
    hooks = {"before_model_call": ["no_such_module_of_hooks:hook"]}
    error = await start_fails(tmp_path, hooks=hooks)
    assert "cannot load the hooks" in str(error)
    assert "AGIO_HOOKS" in error.setting


async def test_a_taken_port_fails_before_the_store_opens(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        address = f"127.0.0.1:{taken.getsockname()[1]}"
        error = await start_fails(tmp_path, listen_address=address)
    assert str(error).startswith(f"cannot listen on {address}: the port is in use")
    assert error.setting == "AGIO_LISTEN_ADDRESS"
    assert not (tmp_path / "agio.db").exists()  # nothing was started


async def test_a_taken_member_address_names_its_setting(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        address = f"127.0.0.1:{taken.getsockname()[1]}"
        error = await start_fails(tmp_path, server=ServerConfig(member_address=address))
    assert str(error).startswith(f"cannot listen on {address}: the port is in use")
    assert error.setting == "AGIO_SERVER__MEMBER_ADDRESS"
    assert not (tmp_path / "agio.db").exists()  # nothing was started


def test_an_address_of_another_machine_says_so() -> None:
    with pytest.raises(StartupError, match="no such address"):
        check_bindable("192.0.2.1:50051")  # TEST-NET-1: never an address of this machine
    check_bindable("127.0.0.1:0")  # any free port always binds


def test_each_invalid_setting_is_one_line_naming_its_variable() -> None:
    with pytest.raises(ValidationError) as invalid:
        Settings(listen_address="nonsense", server={"max_running_runs": -1})
    lines = configuration_lines(invalid.value)
    assert len(lines) == 2
    assert lines[0].startswith("invalid configuration: listen_address [AGIO_LISTEN_ADDRESS]: ")
    assert "must be host:port" in lines[0]
    assert lines[1].startswith(
        "invalid configuration: server.max_running_runs [AGIO_SERVER__MAX_RUNNING_RUNS]: "
    )


@pytest.mark.parametrize("size", ["0", "-1", "1001", "ten", "1e3", "99999999999999999999"])
def test_a_database_pool_size_out_of_range_names_its_variable(
    size: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AGIO_DATABASE_POOL_SIZE", size)
    with pytest.raises(ValidationError) as invalid:
        Settings()
    (line,) = configuration_lines(invalid.value)
    assert line.startswith(
        "invalid configuration: database_pool_size [AGIO_DATABASE_POOL_SIZE]: "
    ), line


def test_the_database_pool_size_is_read_from_its_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Settings().database_pool_size == 20
    with pytest.raises(ValidationError):  # a config file may hold what a variable cannot
        Settings(database_pool_size="2\x00")
    monkeypatch.setenv("AGIO_DATABASE_POOL_SIZE", "5")
    assert Settings().database_pool_size == 5


@pytest.mark.parametrize(
    ("text", "complaint"),
    [
        (
            "agents:\n  - name: a\n    model: [x\n",
            "is not valid YAML: expected ',' or ']', but got '<stream end>' at line 4, "
            "column 1 (while parsing a flow sequence at line 3, column 12)",
        ),
        (
            "server:\n\tworkers: 2\n",
            "is not valid YAML: found character '\\t' that cannot start any token at line 2, "
            "column 1",
        ),
        (
            "- name: a\n",
            "must be a YAML mapping of settings (`agents:`, `server:`, ...), not a list",
        ),
        ("agents: \xff\n", "is not UTF-8 text: byte 8 is 0xff"),
    ],
    ids=["unclosed-list", "tab", "not-a-mapping", "not-utf-8"],
)
def test_a_config_file_that_is_not_yaml_settings_is_one_line_naming_it_and_exit_2(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    text: str,
    complaint: str,
) -> None:
    config = tmp_path / "agio.yaml"
    config.write_bytes(text.encode("latin-1"))
    monkeypatch.setenv("AGIO_CONFIG", str(config))
    assert main(["serve"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"agio-grpc: invalid configuration: the config file {config} (AGIO_CONFIG) {complaint}"
    ]

    assert main(["serve", "--debug"]) == 2
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err
    assert err.splitlines()[-1].endswith(complaint)


def test_an_empty_config_file_sets_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "agio.yaml"
    config.write_text("# nothing yet\n")
    monkeypatch.setenv("AGIO_CONFIG", str(config))
    assert Settings().agents[0].name == "assistant"


@pytest.mark.parametrize(
    ("url", "key", "warned"),
    [
        ("https://api.openai.com/v1", None, True),
        ("https://user:secret@llm.example.com:8443/v1", None, True),
        ("https://api.openai.com/v1", "sk-test", False),
        (None, None, False),  # the built-in fake model
        ("http://127.0.0.1:11434/v1", None, False),  # Ollama on this machine
        ("http://localhost:8000/v1", None, False),
        ("http://[::1]:8000/v1", None, False),
    ],
)
def test_a_model_url_without_a_key_is_warned_about_unless_it_is_on_this_machine(
    url: str | None, key: str | None, warned: bool
) -> None:
    warning = model_key_warning(Settings(openai_base_url=url, openai_api_key=key))
    assert (warning is not None) == warned
    if warning is not None:
        assert "set OPENAI_API_KEY" in warning
        assert "secret" not in warning
        assert "user" not in warning


async def serve_output(tmp_path: Path, env: dict[str, str], *args: str) -> tuple[int, str]:
    """`agio-grpc serve` as a user runs it; its exit code and stderr."""
    clean = {key: value for key, value in os.environ.items() if not key.startswith("AGIO_")}
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "agio_grpc.cli",
        "serve",
        *args,
        env=clean | {"AGIO_LISTEN_ADDRESS": "127.0.0.1:0"} | env,
        cwd=tmp_path,
        stderr=asyncio.subprocess.PIPE,
    )
    _, stderr = await process.communicate()
    assert process.returncode is not None
    return process.returncode, stderr.decode()


@pytest.mark.slow  # a real `agio-grpc serve` process
async def test_serve_says_a_start_up_error_in_one_line_and_exits_2(tmp_path: Path) -> None:
    env = {"AGIO_TOOL_MODULES": '["no_such_module_of_tools"]'}
    code, stderr = await serve_output(tmp_path, env)
    assert code == 2
    assert stderr.splitlines() == [
        "agio-grpc: cannot start: cannot load the tools: cannot import "
        "'no_such_module_of_tools' (from 'no_such_module_of_tools'): No module named "
        "'no_such_module_of_tools' [AGIO_TOOL_MODULES, or an agent's tools in AGIO_CONFIG]: "
        "check the name (package.module or package.module:attribute) and that the module "
        "imports from the server's Python path (PYTHONPATH)"
    ]

    code, stderr = await serve_output(tmp_path, env, "--debug")
    assert code == 2
    assert "Traceback (most recent call last)" in stderr
    assert stderr.splitlines()[-1].startswith("agio-grpc: cannot start: cannot load the tools")
