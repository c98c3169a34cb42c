"""Tests for gateway.config: the YAML file of external MCP servers."""

from __future__ import annotations

import json
import pickle
import re
from pathlib import Path

import pytest
from pydantic import ValidationError

from gateway.config.loader import ConfigError, GatewayConfig, ServerConfig, ToolFilter, load_config, parse_config

ENV = {"GH_TOKEN": "ghp_TOPSECRET1", "REMOTE_TOKEN": "tok_TOPSECRET2", "REMOTE_KEY": "key_TOPSECRET3"}

FULL_EXAMPLE = """\
mcps:
  github:
    name: GitHub
    description: Issues, pull requests and code search
    command: npx
    args: ["-y", "@modelcontextprotocol/server-github"]
    env: {LOG_LEVEL: info}
    cwd: /tmp
    credentials:
      GITHUB_PERSONAL_ACCESS_TOKEN_env: GH_TOKEN
    capabilities: [code, issues]
    enabled: true
    timeout: 30
    tools: {allow: ["search_*", "get_*"], deny: ["*delete*"]}
    prefix: gh
  remote:
    url: https://example.com/mcp
    headers: {Authorization: "Bearer ${REMOTE_TOKEN}"}
    credentials: {X-Api-Key_env: REMOTE_KEY}
  legacy:
    url: http://127.0.0.1:9000/sse
    transport: sse
plugins:
  notes: {directory: ./notes}
"""


def write(tmp_path: Path, text: str, name: str = "external-mcps.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def error_for(text: str, environ: dict[str, str] | None = None) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        parse_config(text, Path("external-mcps.yaml"), environ or {})
    return info.value


def server(text: str, environ: dict[str, str] | None = None, sid: str = "s") -> ServerConfig:
    return parse_config(text, Path("external-mcps.yaml"), environ or {}).servers[sid]


# --- the full example -------------------------------------------------------------------------


def test_the_documented_example_loads_every_field(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, FULL_EXAMPLE), ENV)

    assert isinstance(config, GatewayConfig)
    assert list(config.servers) == ["github", "remote", "legacy"]
    github = config.servers["github"]
    assert github.id == "github"
    assert github.name == "GitHub"
    assert github.description == "Issues, pull requests and code search"
    assert github.transport == "stdio"
    assert github.command == "npx"
    assert github.args == ["-y", "@modelcontextprotocol/server-github"]
    assert github.env == {"LOG_LEVEL": "info"}
    assert github.cwd == "/tmp"
    assert github.secret_env == {"GITHUB_PERSONAL_ACCESS_TOKEN": "ghp_TOPSECRET1"}
    assert github.secret_headers == {}
    assert github.capabilities == ["code", "issues"]
    assert github.enabled is True
    assert github.timeout == 30.0
    assert github.tools == ToolFilter(allow=["search_*", "get_*"], deny=["*delete*"])
    assert github.prefix == "gh"
    assert config.plugins == {"notes": {"directory": "./notes"}}


def test_defaults_fill_name_prefix_and_the_rest() -> None:
    legacy = server("mcps:\n  s:\n    url: http://127.0.0.1:9000/sse\n    transport: sse\n")

    assert legacy.name == "s"
    assert legacy.prefix == "s"
    assert legacy.description == ""
    assert legacy.enabled is True
    assert legacy.timeout is None
    assert legacy.capabilities == []
    assert legacy.tools == ToolFilter()
    assert legacy.headers == {} and legacy.secret_headers == {}


# --- transports -------------------------------------------------------------------------------


def test_a_command_makes_a_stdio_server() -> None:
    s = server("mcps:\n  s:\n    command: uvx\n    args: [mcp-server-time]\n")
    assert (s.transport, s.command, s.url) == ("stdio", "uvx", None)


def test_a_url_makes_a_streamable_http_server() -> None:
    s = server("mcps:\n  s:\n    url: https://example.com/mcp\n")
    assert (s.transport, s.url, s.command) == ("http", "https://example.com/mcp", None)


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("http", "http"),
        ("streamableHttp", "http"),
        ("streamable-http", "http"),
        ("streamable_http", "http"),
        ("shttp", "http"),
        ("HTTP", "http"),
        ("StreamableHTTP", "http"),
        ("Streamable-Http", "http"),
        ("SHTTP", "http"),
        ("sse", "sse"),
    ],
)
def test_an_explicit_url_transport_is_normalised(given: str, expected: str) -> None:
    s = server(f"mcps:\n  s:\n    url: https://example.com/x\n    transport: {given}\n")
    assert s.transport == expected


@pytest.mark.parametrize(("given", "expected"), [("stdio", "stdio"), ("streamableHttp", "http"), ("sse", "sse")])
def test_type_is_a_synonym_of_transport_under_mcps(given: str, expected: str) -> None:
    where = "command: x" if expected == "stdio" else "url: https://example.com/x"
    s = server(f"mcps:\n  s:\n    {where}\n    type: {given}\n")
    assert s.transport == expected


def test_both_type_and_transport_under_mcps_is_an_error() -> None:
    err = error_for("mcps:\n  s:\n    url: http://x\n    transport: sse\n    type: sse\n")
    assert str(err) == "external-mcps.yaml:5: mcps.s.type: give either `transport` or `type`, not both"


def test_a_type_that_disagrees_with_command_is_an_error_at_type() -> None:
    err = error_for("mcps:\n  s:\n    command: x\n    type: http\n")
    assert str(err) == "external-mcps.yaml:4: mcps.s.type: transport http needs `url`, but this server has `command`"


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:9000/sse",
        "http://127.0.0.1:9000/sse/",
        "http://127.0.0.1:9000/sse?session=1",
        "http://127.0.0.1:9000/sse/?session=1",
        "https://example.com/v1/sse#x",
    ],
)
def test_a_url_ending_in_sse_makes_an_sse_server(url: str) -> None:
    assert server(f"mcps:\n  s:\n    url: '{url}'\n").transport == "sse"


@pytest.mark.parametrize(
    "url",
    [
        "https://example.com/mcp",
        "https://example.com/",
        "https://example.com",
        "https://example.com/sse/mcp",
        "https://example.com/mysse",
        "https://example.com/mcp?transport=/sse",
        "https://sse.example.com/mcp",
    ],
)
def test_any_other_url_makes_a_streamable_http_server(url: str) -> None:
    assert server(f"mcps:\n  s:\n    url: '{url}'\n").transport == "http"


def test_an_explicit_http_transport_overrides_an_sse_looking_url() -> None:
    for section, key in (("mcps", "transport"), ("mcps", "type"), ("mcpServers", "type"), ("servers", "type")):
        s = server(f"{section}:\n  s:\n    url: http://127.0.0.1:9000/sse\n    {key}: http\n")
        assert s.transport == "http"


def test_the_sse_guess_looks_at_the_url_after_interpolation() -> None:
    s = server("mcps:\n  s:\n    url: 'http://127.0.0.1:9000/${ENDPOINT}'\n", {"ENDPOINT": "sse"})
    assert s.transport == "sse"


def test_an_explicit_stdio_transport_is_accepted_with_a_command() -> None:
    assert server("mcps:\n  s:\n    command: x\n    transport: stdio\n").transport == "stdio"


def test_a_transport_that_disagrees_with_command_is_an_error() -> None:
    err = error_for("mcps:\n  s:\n    command: x\n    transport: sse\n")
    assert (err.line, err.key) == (4, "mcps.s.transport")
    assert err.message == "transport sse needs `url`, but this server has `command`"


def test_a_transport_that_disagrees_with_url_is_an_error() -> None:
    err = error_for("mcps:\n  s:\n    url: http://x\n    transport: stdio\n")
    assert (err.line, err.key) == (4, "mcps.s.transport")
    assert "transport stdio needs `command`" in err.message


@pytest.mark.parametrize(("key", "value"), [("transport", "websocket"), ("type", "streamable http"), ("type", "1")])
def test_an_unknown_transport_is_an_error_listing_the_accepted_ones(key: str, value: str) -> None:
    err = error_for(f"mcps:\n  s:\n    url: http://x\n    {key}: {value}\n")
    assert str(err) == (
        f"external-mcps.yaml:4: mcps.s.{key}: must be stdio, sse or http "
        "(http may also be written streamableHttp, streamable-http, streamable_http or shttp)"
    )


# --- protocol ---------------------------------------------------------------------------------


def test_protocol_defaults_to_auto() -> None:
    assert server("mcps:\n  s:\n    command: x\n").protocol == "auto"
    assert ServerConfig.model_validate({"id": "s", "transport": "stdio", "command": "x"}).protocol == "auto"


@pytest.mark.parametrize("section", ["mcps", "mcpServers", "servers"])
@pytest.mark.parametrize("value", ["auto", "legacy"])
def test_protocol_is_accepted_in_every_server_section(section: str, value: str) -> None:
    s = server(f"{section}:\n  s:\n    url: https://example.com/mcp\n    protocol: {value}\n")
    assert s.protocol == value


@pytest.mark.parametrize("bad", ["modern", "Legacy", "true", "2025-06-18"])
def test_an_invalid_protocol_names_the_key_and_the_allowed_values(bad: str) -> None:
    err = error_for(f"mcps:\n  ok:\n    command: x\n  s:\n    command: x\n    protocol: {bad}\n")
    assert str(err) == "external-mcps.yaml:6: mcps.s.protocol: must be one of auto, legacy"


def test_an_invalid_protocol_under_mcp_servers_names_that_key_path() -> None:
    err = error_for("mcpServers:\n  s:\n    command: x\n    protocol: new\n")
    assert str(err) == "external-mcps.yaml:4: mcpServers.s.protocol: must be one of auto, legacy"


def test_server_config_itself_refuses_an_unknown_protocol() -> None:
    with pytest.raises(ValidationError):
        ServerConfig.model_validate({"id": "s", "transport": "stdio", "command": "x", "protocol": "modern"})


# --- a whole command line in `command` --------------------------------------------------------


def test_a_command_with_spaces_and_no_args_is_an_error_showing_the_split() -> None:
    err = error_for('mcps:\n  s:\n    command: "node /srv/server.js --port 3"\n    env: {A: b}\n')
    assert (err.line, err.key) == (3, "mcps.s.command")
    assert err.message == (
        'command "node /srv/server.js --port 3" contains spaces; put the program in command and its '
        'arguments in args, e.g. command: node, args: ["/srv/server.js", "--port", "3"]'
    )


def test_the_suggested_split_follows_shell_quoting() -> None:
    err = error_for("mcpServers:\n  s:\n    command: npx -y 'my server' --name=\"a b\"\n    args: []\n")
    assert (err.line, err.key) == (3, "mcpServers.s.command")
    assert err.message.endswith('e.g. command: npx, args: ["-y", "my server", "--name=a b"]')


def test_a_command_with_unbalanced_quotes_is_still_split_on_spaces() -> None:
    err = error_for("mcps:\n  s:\n    command: node 'server.js\n")
    assert err.message.endswith("""e.g. command: node, args: ["'server.js"]""")


def test_a_command_with_spaces_and_args_is_left_alone() -> None:
    s = server("mcps:\n  s:\n    command: /opt/My Tools/server\n    args: [--stdio]\n")
    assert (s.command, s.args) == ("/opt/My Tools/server", ["--stdio"])


def test_a_command_with_spaces_that_is_an_existing_file_is_accepted(tmp_path: Path) -> None:
    program = tmp_path / "My Tools" / "server"
    program.parent.mkdir()
    program.write_text("#!/bin/sh\n")
    s = server(f"mcps:\n  s:\n    command: '{program}'\n")
    assert (s.command, s.args) == (str(program), [])


def test_a_stdio_servers_cwd_is_relative_to_the_config_files_folder_which_is_also_its_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # the current directory plays no part
    config = tmp_path / "conf" / "gateway.yaml"
    text = "mcps:\n  a: {command: x}\n  b: {command: x, cwd: sub}\n  c: {command: x, cwd: /srv}\n  d: {url: http://h}\n"
    servers = parse_config(text, config, {}).servers
    assert servers["a"].cwd == str(tmp_path / "conf")
    assert servers["b"].cwd == str(tmp_path / "conf" / "sub")
    assert servers["c"].cwd == "/srv"
    assert servers["d"].cwd is None
    # A config path given relative to the current directory (as a shell gives it) is made absolute.
    assert parse_config(text, Path("conf/gateway.yaml"), {}).servers["a"].cwd == str(tmp_path / "conf")


def test_a_jwks_file_is_relative_to_the_config_files_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    text = "auth:\n  jwt: {jwks_file: keys/jwks.json, issuer: i, audience: a}\n"
    jwt = parse_config(text, tmp_path / "conf" / "gateway.yaml", {}).auth.jwt
    assert jwt is not None and jwt.jwks_file == tmp_path / "conf" / "keys" / "jwks.json"


def test_a_command_with_spaces_that_is_a_file_under_cwd_is_accepted(tmp_path: Path) -> None:
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "my server").write_text("#!/bin/sh\n")
    s = server(f"mcps:\n  s:\n    command: 'bin/my server'\n    cwd: '{tmp_path}'\n")
    assert s.command == "bin/my server"


def test_surrounding_spaces_alone_do_not_count_as_a_command_line() -> None:
    assert server("mcps:\n  s:\n    command: ' uvx '\n").command == " uvx "


def test_the_command_line_error_masks_interpolated_parts() -> None:
    text = "mcps:\n  s:\n    command: ${BIN} --token ${TOKEN}\n"
    err = error_for(text, {"BIN": "/usr/bin/tool", "TOKEN": "tok_TOPSECRET"})
    assert "TOPSECRET" not in str(err) and "/usr/bin/tool" not in str(err)
    assert err.message == (
        'command "*** --token ***" contains spaces; put the program in command and its arguments in args, '
        'e.g. command: ***, args: ["--token", "***"]'
    )


def test_spaces_that_come_only_from_a_variable_are_reported_without_its_value() -> None:
    err = error_for("mcps:\n  s:\n    command: ${CMD}\n", {"CMD": "node server.js"})
    assert str(err) == (
        "external-mcps.yaml:3: mcps.s.command: contains spaces after ${...} substitution; "
        "put the program in command and its arguments in args"
    )


def test_both_command_and_url_is_an_error_at_the_server_key() -> None:
    err = error_for("mcps:\n  ok:\n    command: a\n  s:\n    command: x\n    url: http://x\n")
    assert (err.line, err.key) == (4, "mcps.s")
    assert "has both `command` and `url`" in err.message


def test_neither_command_nor_url_is_an_error_at_the_server_key() -> None:
    err = error_for("mcps:\n  s:\n    name: Nothing\n")
    assert str(err) == "external-mcps.yaml:2: mcps.s: needs `command` (stdio) or `url` (http/sse)"


def test_stdio_only_keys_on_a_url_server_are_an_error() -> None:
    err = error_for("mcps:\n  s:\n    url: http://x\n    args: [a]\n")
    assert (err.line, err.key) == (4, "mcps.s.args")
    assert err.message == "`args` only applies to stdio servers (with `command`)"


def test_headers_on_a_stdio_server_are_an_error() -> None:
    err = error_for("mcps:\n  s:\n    command: x\n    headers: {A: b}\n")
    assert (err.line, err.key) == (4, "mcps.s.headers")


def test_a_url_must_be_http_or_https() -> None:
    err = error_for("mcps:\n  s:\n    url: ftp://example.com\n")
    assert str(err) == "external-mcps.yaml:3: mcps.s.url: must be an http:// or https:// URL"


# --- credentials ------------------------------------------------------------------------------


def test_credentials_become_environment_variables_for_a_stdio_server() -> None:
    s = server("mcps:\n  s:\n    command: x\n    credentials: {API_TOKEN_env: MY_TOKEN}\n", {"MY_TOKEN": "t0k"})
    assert s.secret_env == {"API_TOKEN": "t0k"}
    assert s.env == {} and s.secret_headers == {}


def test_credentials_become_headers_for_http_and_sse_servers() -> None:
    for transport in ("http", "sse"):
        text = f"mcps:\n s:\n  url: http://x\n  transport: {transport}\n  credentials: {{X-Api-Key_env: K}}"
        s = server(text, {"K": "v4lue"})
        assert s.secret_headers == {"X-Api-Key": "v4lue"}
        assert s.headers == {} and s.secret_env == {}


def test_a_missing_credential_variable_makes_only_that_server_unusable_naming_the_key() -> None:
    config = parse_config(FULL_EXAMPLE, Path("external-mcps.yaml"), {"REMOTE_TOKEN": "x", "REMOTE_KEY": "y"})
    assert set(config.servers) == {"remote", "legacy"}, "the others are served"
    github = config.unusable["github"]
    assert (github.prefix, github.transport, github.enabled) == ("gh", "stdio", True)
    assert github.reason == (
        "external-mcps.yaml:10: mcps.github.credentials.GITHUB_PERSONAL_ACCESS_TOKEN_env: "
        "environment variable GH_TOKEN is not set"
    )


def test_a_credential_that_is_also_a_plain_header_is_an_error() -> None:
    text = """\
mcps:
  s:
    url: http://x
    headers: {authorization: a}
    credentials:
      Authorization_env: T
"""
    err = error_for(text, {"T": "secret"})
    assert str(err) == (
        "external-mcps.yaml:6: mcps.s.credentials.Authorization_env: "
        "Authorization is also set in `headers`; set it in one place"
    )


def test_environment_variable_names_are_case_sensitive_for_that_check() -> None:
    text = "mcps:\n  s:\n    command: x\n    env: {token: plain}\n    credentials: {TOKEN_env: T}\n"
    s = server(text, {"T": "secret"})
    assert (s.env, s.secret_env) == ({"token": "plain"}, {"TOKEN": "secret"})


def test_a_credential_key_without_the_env_suffix_is_an_error() -> None:
    err = error_for("mcps:\n  s:\n    command: x\n    credentials:\n      TOKEN: T\n")
    assert (err.line, err.key) == (5, "mcps.s.credentials.TOKEN")
    assert "NAME_env" in err.message


# --- interpolation ----------------------------------------------------------------------------


def test_variables_are_interpolated_in_every_string_value() -> None:
    text = """\
mcps:
  s:
    name: ${NAME}
    description: runs in ${REGION}
    command: ${BIN}
    args: [--region, "${REGION}"]
    env: {HOME_DIR: "${HOME_DIR}"}
    cwd: ${HOME_DIR}/work
"""
    env = {"NAME": "Svc", "REGION": "eu", "BIN": "/usr/bin/svc", "HOME_DIR": "/home/me"}
    s = server(text, env)
    assert (s.name, s.description, s.command, s.cwd) == ("Svc", "runs in eu", "/usr/bin/svc", "/home/me/work")
    assert s.args == ["--region", "eu"]
    assert s.env == {"HOME_DIR": "/home/me"}


def test_interpolation_works_in_url_and_headers() -> None:
    text = 'mcps:\n  s:\n    url: "https://${HOST}/mcp"\n    headers: {Authorization: "Bearer ${T}"}\n'
    s = server(text, {"HOST": "example.org", "T": "abc"})
    assert s.url == "https://example.org/mcp"
    assert s.headers == {"Authorization": "Bearer abc"}


def test_a_default_is_used_when_the_variable_is_unset_or_empty() -> None:
    text = 'mcps:\n  s:\n    command: x\n    args: ["${A:-one}", "${B:-two}", "${C:-three}", "${D:-}"]\n'
    assert server(text, {"A": "set", "B": ""}).args == ["set", "two", "three", ""]


def test_double_dollar_brace_is_a_literal_dollar_brace() -> None:
    text = 'mcps:\n  s:\n    command: x\n    args: ["$${HOME}", "cost $5", "$${X:-y}"]\n'
    assert server(text).args == ["${HOME}", "cost $5", "${X:-y}"]


def test_a_missing_environment_variable_makes_only_that_server_unusable_naming_the_key() -> None:
    config = parse_config(FULL_EXAMPLE, Path("external-mcps.yaml"), {"GH_TOKEN": "x", "REMOTE_KEY": "y"})
    assert set(config.servers) == {"github", "legacy"}
    remote = config.unusable["remote"]
    assert (remote.prefix, remote.transport) == ("remote", "http")
    assert remote.reason == (
        "external-mcps.yaml:18: mcps.remote.headers.Authorization: environment variable REMOTE_TOKEN "
        "is not set (use ${REMOTE_TOKEN:-default} for a default)"
    )


def test_a_missing_variable_in_a_list_names_the_item() -> None:
    config = parse_config(
        "mcps:\n  s:\n    command: x\n    args:\n      - a\n      - ${NOPE}\n", Path("external-mcps.yaml"), {}
    )
    assert config.unusable["s"].reason.startswith("external-mcps.yaml:6: mcps.s.args[1]: environment variable NOPE")


def test_a_disabled_server_missing_a_variable_stays_disabled() -> None:
    text = "mcps:\n  s:\n    url: https://x/sse\n    enabled: false\n    headers: {A: '${NOPE}'}\n"
    config = parse_config(text, Path("external-mcps.yaml"), {})
    assert (config.unusable["s"].enabled, config.unusable["s"].transport) == (False, "sse")


def test_a_malformed_reference_is_an_error() -> None:
    err = error_for("mcps:\n  s:\n    command: ${oops\n")
    assert (err.line, err.key) == (3, "mcps.s.command")
    assert "write $${ for a literal ${" in err.message


def test_keys_are_never_interpolated() -> None:
    s = server("mcps:\n  s:\n    command: x\n    env: {'${K}': v}\n", {"K": "no"})
    assert s.env == {"${K}": "v"}


def test_plugin_settings_are_interpolated_too() -> None:
    config = parse_config(
        "plugins:\n  notes: {directory: '${DIR}', n: 1, lit: '$${X}'}\n", Path("x.yaml"), {"DIR": "/d"}
    )
    assert config.plugins == {"notes": {"directory": "/d", "n": 1, "lit": "${X}"}}
    with pytest.raises(ConfigError, match=r"x.yaml:2: plugins.notes.directory: environment variable DIR is not set"):
        parse_config("plugins:\n  notes: {directory: '${DIR}'}\n", Path("x.yaml"), {})


def test_interpolation_reads_os_environ_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GW_TEST_BIN", "/opt/bin/tool")
    config = parse_config("mcps:\n  s:\n    command: ${GW_TEST_BIN}\n", Path("x.yaml"))
    assert config.servers["s"].command == "/opt/bin/tool"


# --- secrets never show -----------------------------------------------------------------------


def test_repr_and_str_never_contain_a_secret_value(tmp_path: Path) -> None:
    text = FULL_EXAMPLE.replace("cwd: /tmp", 'cwd: /tmp\n    env: {LITERAL: "lit_TOPSECRET4"}').replace(
        "    env: {LOG_LEVEL: info}\n", '    args: ["--token=${GH_TOKEN}"]\n', 1
    )
    text = text.replace('    args: ["-y", "@modelcontextprotocol/server-github"]\n', "")
    config = load_config(write(tmp_path, text), ENV)
    github, remote = config.servers["github"], config.servers["remote"]
    assert github.args == ["--token=ghp_TOPSECRET1"]  # the real value is there for the proxy

    shown = [repr(github), str(github), repr(remote), str(remote), repr(config), str(config)]
    for text_shown in shown:
        for secret in ("TOPSECRET1", "TOPSECRET2", "TOPSECRET3", "TOPSECRET4"):
            assert secret not in text_shown
    assert "--token=***" in repr(github)
    assert "'Authorization': '***'" in repr(remote)


# --- Claude Desktop / Cursor layout -----------------------------------------------------------


def test_a_claude_desktop_json_file_loads(tmp_path: Path) -> None:
    claude = {
        "mcpServers": {
            "filesystem": {
                "command": "npx",
                "args": ["-y", "@modelcontextprotocol/server-filesystem", "/Users/me/Desktop"],
                "env": {"DEBUG": "1"},
            },
            "remote": {"url": "https://example.com/mcp", "headers": {"Authorization": "Bearer x"}},
        }
    }
    path = write(tmp_path, json.dumps(claude, indent=2), "claude_desktop_config.json")

    config = load_config(path, {})

    fs, remote = config.servers["filesystem"], config.servers["remote"]
    assert (fs.transport, fs.command, fs.args) == ("stdio", "npx", claude["mcpServers"]["filesystem"]["args"])
    assert fs.env == {"DEBUG": "1"}
    assert (remote.transport, remote.url, remote.headers) == (
        "http",
        "https://example.com/mcp",
        {"Authorization": "Bearer x"},
    )


def test_a_tab_indented_json_file_loads(tmp_path: Path) -> None:
    text = json.dumps({"mcpServers": {"a": {"command": "x", "args": ["a\tb"]}}}, indent="\t")
    config = load_config(write(tmp_path, text, "mcp.json"), {})
    assert config.servers["a"].args == ["a\tb"]


def test_a_json_schema_error_reports_its_line(tmp_path: Path) -> None:
    text = '{\n  "mcpServers": {\n    "a": {\n      "command": "x",\n      "timeout": 0\n    }\n  }\n}\n'
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, text, "mcp.json"), {})
    assert str(info.value) == f"{tmp_path / 'mcp.json'}:5: mcpServers.a.timeout: must be a positive number of seconds"


@pytest.mark.parametrize(("given", "expected"), [("sse", "sse"), ("http", "http"), ("streamable-http", "http")])
def test_cursor_style_url_entries_take_a_type(given: str, expected: str) -> None:
    s = server(f"mcpServers:\n  s:\n    url: http://localhost:8000/sse\n    type: {given}\n")
    assert s.transport == expected


def test_disabled_true_turns_a_server_off() -> None:
    # `off` and `on` are booleans in YAML 1.1, but keys are always read as text.
    text = "mcpServers:\n  off:\n    command: x\n    disabled: true\n  on:\n    command: y\n    disabled: no"
    config = parse_config(text, Path("x.json"), {})
    assert config.servers["off"].enabled is False
    assert config.servers["on"].enabled is True
    assert [s.id for s in config.enabled_servers()] == ["on"]


def test_mcps_and_mcp_servers_can_be_combined_in_file_order() -> None:
    text = "mcpServers:\n  b:\n    command: x\nmcps:\n  a:\n    command: y\n"
    assert list(parse_config(text, Path("x.yaml"), {}).servers) == ["b", "a"]


def test_the_same_id_in_mcps_and_mcp_servers_is_an_error() -> None:
    err = error_for("mcps:\n  a:\n    command: x\nmcpServers:\n  a:\n    command: y\n")
    assert str(err) == "external-mcps.yaml:5: mcpServers.a: server 'a' is also defined under mcps (line 2)"


def test_both_type_and_transport_is_an_error() -> None:
    err = error_for("mcpServers:\n  s:\n    url: http://x\n    transport: sse\n    type: sse\n")
    assert (err.line, err.key) == (5, "mcpServers.s.type")


# --- VS Code mcp.json layout ------------------------------------------------------------------


def test_a_vs_code_mcp_json_file_loads(tmp_path: Path) -> None:
    vscode = {
        "inputs": [{"type": "promptString", "id": "api-key", "description": "API key", "password": True}],
        "servers": {
            "fetch": {"type": "stdio", "command": "uvx", "args": ["mcp-server-fetch"], "env": {"A": "b"}},
            "remote": {"type": "http", "url": "https://example.com/mcp", "headers": {"X-Team": "t"}},
            "old": {"type": "sse", "url": "https://example.com/events", "protocol": "legacy"},
        },
    }
    config = load_config(write(tmp_path, json.dumps(vscode, indent="\t"), "mcp.json"), {})

    assert list(config.servers) == ["fetch", "remote", "old"]
    fetch, remote, old = config.servers.values()
    assert (fetch.transport, fetch.command, fetch.args, fetch.env) == ("stdio", "uvx", ["mcp-server-fetch"], {"A": "b"})
    assert (remote.transport, remote.url, remote.headers) == ("http", "https://example.com/mcp", {"X-Team": "t"})
    assert (old.transport, old.protocol) == ("sse", "legacy")


def test_servers_takes_the_same_keys_as_mcp_servers() -> None:
    text = "servers:\n  a:\n    command: x\n    disabled: true\n  b:\n    url: http://h/sse\n"
    config = parse_config(text, Path("mcp.json"), {})
    assert config.servers["a"].enabled is False
    assert config.servers["b"].transport == "sse"


def test_an_empty_servers_section_loads() -> None:
    for text in ("servers: {}\n", "servers:\n", "inputs: []\nservers: {}\n"):
        config = parse_config(text, Path("mcp.json"), {})
        assert config.servers == {}


def test_the_same_id_in_servers_and_mcps_is_an_error() -> None:
    err = error_for("mcps:\n  a:\n    command: x\nservers:\n  a:\n    command: y\n")
    assert str(err) == "external-mcps.yaml:5: servers.a: server 'a' is also defined under mcps (line 2)"


def test_an_unknown_key_under_servers_names_its_path() -> None:
    err = error_for("servers:\n  s:\n    command: x\n    gallery: true\n")
    assert (err.line, err.key) == (4, "servers.s.gallery")


def test_inputs_is_ignored_whatever_it_holds() -> None:
    text = "inputs:\n  - {type: promptString, id: 'x', description: '${input:y}'}\nmcps:\n  s:\n    command: x\n"
    assert list(parse_config(text, Path("x.yaml"), {}).servers) == ["s"]


def test_an_input_reference_is_an_error_naming_the_key() -> None:
    text = 'servers:\n  s:\n    url: https://x/mcp\n    headers:\n      Authorization: "Bearer ${input:api-key}"\n'
    err = error_for(text)
    assert str(err) == (
        "external-mcps.yaml:5: servers.s.headers.Authorization: ${input:api-key} is a VS Code input, "
        "which the gateway does not support; use an environment variable (${NAME}) or `credentials` instead"
    )


def test_a_variable_named_input_with_a_default_is_still_a_variable() -> None:
    assert server("mcps:\n  s:\n    command: x\n    args: ['${input:-fallback}']\n").args == ["fallback"]


# --- enabled / disabled -----------------------------------------------------------------------


def test_enabled_false_keeps_the_server_but_not_in_enabled_servers() -> None:
    text = "mcps:\n  a:\n    command: x\n    enabled: false\n  b:\n    command: y\n"
    config = parse_config(text, Path("x.yaml"), {})
    assert list(config.servers) == ["a", "b"]
    assert [s.id for s in config.enabled_servers()] == ["b"]


def test_enabled_must_be_a_boolean() -> None:
    err = error_for("mcps:\n  s:\n    command: x\n    enabled: maybe\n")
    assert (err.line, err.key) == (4, "mcps.s.enabled")


# --- unknown keys -----------------------------------------------------------------------------


def test_an_unknown_top_level_key_suggests_the_close_one() -> None:
    err = error_for("mcp:\n  s:\n    command: x\n")
    assert str(err) == "external-mcps.yaml:1: mcp: unknown key 'mcp' (did you mean 'mcps'?)"


def test_an_unknown_top_level_key_suggests_the_close_one_even_when_empty() -> None:
    for text, close in (("mcp: {}\n", "mcps"), ("server: {}\n", "servers"), ("input: []\n", "inputs")):
        assert error_for(text).message.endswith(f"(did you mean {close!r}?)")


def test_an_unknown_top_level_key_without_a_close_one_lists_the_known_keys() -> None:
    err = error_for("mcps: {}\nwhatever: 1\n")
    assert str(err) == (
        "external-mcps.yaml:2: whatever: unknown key 'whatever'; "
        "known keys: mcps, mcpServers, servers, inputs, plugins, auth, security"
    )


def test_an_unknown_server_key_suggests_the_close_one() -> None:
    err = error_for("mcps:\n  s:\n    command: x\n    timeuot: 5\n")
    assert str(err) == "external-mcps.yaml:4: mcps.s.timeuot: unknown key 'timeuot' (did you mean 'timeout'?)"


def test_an_unknown_server_key_without_a_close_one_lists_the_known_keys_including_the_new_ones() -> None:
    err = error_for("mcps:\n  s:\n    command: x\n    zzz: 1\n")
    assert err.message == (
        "unknown key 'zzz'; known keys: name, description, command, args, env, cwd, url, headers, transport, type, "
        "protocol, credentials, capabilities, enabled, timeout, tools, prefix, tool_timeouts, retry_tools, "
        "max_concurrent_calls, health_interval, start, idle_timeout, forward_caller_token, stderr_log_level, auth"
    )


def test_claude_only_keys_are_unknown_under_mcps() -> None:
    err = error_for("mcps:\n  s:\n    command: x\n    disabled: true\n")
    assert err.message == "unknown key 'disabled' (did you mean 'enabled'?)"


def test_an_unknown_tool_filter_key_suggests_the_close_one() -> None:
    err = error_for("mcps:\n  s:\n    command: x\n    tools:\n      alow: [a]\n")
    assert str(err) == "external-mcps.yaml:5: mcps.s.tools.alow: unknown key 'alow' (did you mean 'allow'?)"


# --- values -----------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", ["0", "-1", "true", ".inf"])
def test_a_timeout_that_is_not_a_positive_number_reports_its_line(bad: str) -> None:
    err = error_for(f"mcps:\n  a:\n    command: x\n  s:\n    command: x\n    timeout: {bad}\n")
    assert str(err) == "external-mcps.yaml:6: mcps.s.timeout: must be a positive number of seconds"


def test_a_timeout_that_is_not_a_number_reports_its_line() -> None:
    err = error_for("mcps:\n  s:\n    command: x\n    timeout: soon\n")
    assert (err.line, err.key) == (4, "mcps.s.timeout")
    assert err.message.startswith("input should be a valid number")


def test_numbers_in_args_and_env_become_strings() -> None:
    s = server("mcps:\n  s:\n    command: x\n    args: [--port, 8080, 1.5]\n    env: {PORT: 8080}\n")
    assert s.args == ["--port", "8080", "1.5"]
    assert s.env == {"PORT": "8080"}


def test_a_boolean_in_args_is_an_error_not_a_guess() -> None:
    err = error_for("mcps:\n  s:\n    command: x\n    args: [--verbose, true]\n")
    assert (err.line, err.key) == (4, "mcps.s.args[1]")


def test_a_nested_list_in_args_is_an_error_at_that_item() -> None:
    err = error_for("mcps:\n  s:\n    command: x\n    args:\n      - ok\n      - [not, ok]\n")
    assert str(err) == "external-mcps.yaml:6: mcps.s.args[1]: input should be a valid string"


def test_a_server_that_is_not_a_mapping_is_an_error() -> None:
    err = error_for("mcps:\n  s: npx server\n")
    assert (err.line, err.key) == (2, "mcps.s")


def test_an_invalid_server_id_is_an_error() -> None:
    err = error_for("mcps:\n  _s:\n    command: x\n")
    assert (err.line, err.key) == (2, "mcps._s")
    assert err.message.startswith("server id must start with a letter or digit")


# --- prefixes ---------------------------------------------------------------------------------


def test_an_empty_prefix_is_accepted_even_twice() -> None:
    text = "mcps:\n  a:\n    command: x\n    prefix: ''\n  b:\n    command: y\n    prefix: ''\n"
    config = parse_config(text, Path("x.yaml"), {})
    assert [s.prefix for s in config.servers.values()] == ["", ""]


def test_a_duplicate_prefix_names_both_servers() -> None:
    text = "mcps:\n  github:\n    command: x\n  gh:\n    command: y\n    prefix: github\n"
    err = error_for(text)
    assert str(err) == (
        "external-mcps.yaml:6: mcps.gh.prefix: prefix 'github' is already used by server 'github' (line 2); "
        "tool names would clash"
    )


@pytest.mark.parametrize("bad", ["a.b", "a b", "x" * 33])
def test_an_invalid_prefix_is_an_error(bad: str) -> None:
    err = error_for(f"mcps:\n  s:\n    command: x\n    prefix: '{bad}'\n")
    assert (err.line, err.key) == (4, "mcps.s.prefix")


def test_an_id_that_cannot_be_a_prefix_asks_for_one() -> None:
    err = error_for("mcps:\n  my.server:\n    command: x\n")
    assert (err.line, err.key) == (2, "mcps.my.server")
    assert err.message.endswith("set `prefix:`")
    assert server("mcps:\n  my.server:\n    command: x\n    prefix: my\n", sid="my.server").prefix == "my"


# --- tool filters -----------------------------------------------------------------------------


def test_an_empty_tool_filter_permits_everything() -> None:
    assert ToolFilter().permits("anything")


def test_allow_globs_limit_the_tools_and_deny_globs_win() -> None:
    tools = ToolFilter(allow=["search_*", "get_*"], deny=["*delete*"])
    assert tools.permits("search_code")
    assert tools.permits("get_issue")
    assert not tools.permits("create_issue")
    assert not tools.permits("get_delete_log")


def test_deny_alone_hides_only_the_matching_tools() -> None:
    tools = ToolFilter(deny=["drop_*"])
    assert tools.permits("select")
    assert not tools.permits("drop_table")


def test_tool_globs_are_case_sensitive() -> None:
    assert not ToolFilter(allow=["search_*"]).permits("SEARCH_code")


# --- YAML problems ----------------------------------------------------------------------------


def test_a_yaml_syntax_error_reports_its_line() -> None:
    err = error_for("mcps:\n  s:\n    command: x\n    args: [a, b\n    env: {}\n")
    assert err.line == 5
    assert err.key is None
    assert str(err) == (
        "external-mcps.yaml:5: invalid YAML: expected ',' or ']', but got ':' "
        "(while parsing a flow sequence started on line 4)"
    )


def test_tab_indentation_gets_a_hint() -> None:
    err = error_for("mcps:\n\ts:\n")
    assert err.line == 2
    assert err.message.endswith("indent with spaces, not tabs")


def test_python_tags_are_refused() -> None:
    err = error_for("mcps: !!python/object/apply:os.system [echo hi]\n")
    assert err.line == 1
    assert err.message.startswith("invalid YAML: could not determine a constructor")


def test_a_character_yaml_forbids_reports_its_line() -> None:
    err = error_for("mcps:\n  s:\n    command: x\n\x00\n")
    assert err.line == 4
    assert err.message.startswith("invalid YAML: unacceptable character #x0000")


def test_an_alias_inside_itself_is_an_error_not_a_crash() -> None:
    err = error_for("mcps:\n  s:\n    command: x\n    args: &a\n      - *a\n")
    assert (err.line, err.key) == (4, "mcps.s.args[0]")  # PyYAML gives an alias its anchor's position


def test_a_duplicate_key_is_an_error_naming_the_key_and_both_lines() -> None:
    err = error_for("mcps:\n  s:\n    command: x\n    args: []\n    command: y\n")
    assert str(err) == "external-mcps.yaml:5: mcps.s.command: duplicate key 'command' (first defined on line 3)"


def test_a_duplicate_server_id_is_an_error() -> None:
    err = error_for("mcps:\n  s:\n    command: x\n  s:\n    command: y\n")
    assert (err.line, err.key) == (4, "mcps.s")


def test_a_top_level_that_is_not_a_mapping_is_an_error() -> None:
    assert str(error_for("- a\n- b\n")) == "external-mcps.yaml:1: the file must be a mapping with a `mcps:` section"


def test_yaml_merge_keys_still_work() -> None:
    text = "mcps:\n  a: &base\n    command: x\n    timeout: 5\n  b:\n    <<: *base\n    prefix: bb\n"
    b = server(text, sid="b")
    assert (b.command, b.timeout, b.prefix) == ("x", 5.0, "bb")


# --- files ------------------------------------------------------------------------------------


def test_an_empty_file_is_a_config_with_no_servers(tmp_path: Path) -> None:
    for text in ("", "# nothing yet\n", "mcps:\n"):
        config = load_config(write(tmp_path, text), {})
        assert config.servers == {} and config.plugins == {} and config.enabled_servers() == []


def test_a_missing_file_says_so_and_how_to_choose_another(tmp_path: Path) -> None:
    path = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError) as info:
        load_config(path)
    err = info.value
    assert (err.path, err.line, err.key) == (path, None, None)
    assert str(err).startswith(f"{path}: file does not exist")
    assert "--config" in str(err) and "GATEWAY_CONFIG" in str(err)


def test_a_file_that_is_not_utf8_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_bytes(b"mcps:\n  s:\n    command: \xff\n")
    with pytest.raises(ConfigError, match="not valid UTF-8"):
        load_config(path, {})


def test_the_error_format_omits_unknown_parts_and_survives_pickling() -> None:
    assert str(ConfigError(Path("f.yaml"), "boom")) == "f.yaml: boom"
    assert str(ConfigError(Path("f.yaml"), "boom", 3)) == "f.yaml:3: boom"
    assert str(ConfigError(Path("f.yaml"), "boom", None, "mcps.a")) == "f.yaml: mcps.a: boom"
    err = pickle.loads(pickle.dumps(ConfigError(Path("f.yaml"), "boom", 3, "mcps.a")))
    assert str(err) == "f.yaml:3: mcps.a: boom"


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("    url: http://127.0.0.1:1/mcp\n    start: on_demand\n", "`start: on_demand` applies to stdio servers"),
        ("    command: x\n    idle_timeout: 10\n", "`idle_timeout` applies to servers with `start: on_demand`"),
        ("    command: x\n    start: lazy\n", "mcps.s.start: input should be 'eager' or 'on_demand'"),
        ("    command: x\n    tool_timeouts: {slow: -1}\n", "tool_timeouts: each timeout must be a positive number"),
        ("    command: x\n    max_concurrent_calls: 0\n", "max_concurrent_calls: input should be greater than"),
    ],
)
def test_resilience_keys_are_checked(body: str, message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        parse_config("mcps:\n  s:\n" + body, Path("x.yaml"), {})


def test_resilience_keys_reach_the_server_config() -> None:
    text = "mcps:\n  s:\n    command: x\n    start: on_demand\n    idle_timeout: 60\n    retry_tools: [get_*]\n"
    s = parse_config(text, Path("x.yaml"), {}).servers["s"]
    assert (s.start, s.idle_timeout, s.retry_tools) == ("on_demand", 60.0, ["get_*"])
