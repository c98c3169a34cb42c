"""One parse of the YAML file into a `GatewayConfig`: servers in their many layouts, `${VAR}`
interpolation, credentials from the environment or files, plugin sections kept raw.

Apart from the loader's entry points (`gateway.config.loader`), which read the file and hand the
text here: this is the bulk of the file's rules, and every problem it finds is one `ConfigError`
at the file's line and key path. Lines come from the composed YAML node tree, which is also where
duplicate keys are caught (PyYAML would silently keep the last one).
"""

from __future__ import annotations

import difflib
import json
import os
import re
import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, TypeVar
from urllib.parse import urlsplit

import yaml
from pydantic import BaseModel, ValidationError

from gateway.config.gateway_config import (
    ConfigError,
    GatewayConfig,
    KeyPath,
    MissingVariable,
    UnusableServer,
    format_key,
    validate_section,
)
from gateway.config.security import AuthConfig, SecurityConfig
from gateway.config.servers import MASK, PREFIX_MAX, PREFIX_RE, SERVER_ID_RE, ServerConfig

__all__ = ["PLUGIN_DIRECTORIES_KEY", "TOP_LEVEL_KEYS", "Parser"]

TOP_LEVEL_KEYS = ("mcps", "mcpServers", "servers", "inputs", "plugins", "auth", "security")
"""Every key allowed at the top of the file. Later sections (e.g. `routing`) add theirs here.
`inputs` (VS Code's prompts for `${input:...}` values) is accepted and ignored."""

PLUGIN_DIRECTORIES_KEY = "directories"
"""`plugins.directories:`: folders to search for plugin directories (not a plugin's name)."""

SERVER_SECTIONS = ("mcps", "mcpServers", "servers")
"""Top-level keys holding servers: ours, Claude Desktop / Cursor's, and VS Code's `mcp.json` one."""

SERVER_KEYS = (
    "name", "description", "command", "args", "env", "cwd", "url", "headers", "transport", "type",
    "protocol", "credentials", "capabilities", "enabled", "timeout", "tools", "prefix",
    "tool_timeouts", "retry_tools", "max_concurrent_calls", "health_interval", "start", "idle_timeout",
    "forward_caller_token", "stderr_log_level", "auth",
)  # fmt: skip
CLAUDE_KEYS = (*SERVER_KEYS, "disabled")  # `mcpServers:` / `servers:` also take Claude Desktop's `disabled`
TOOL_FILTER_KEYS = ("allow", "deny")
RENAMED_KEYS = {"type": "transport", "disabled": "enabled"}  # synonym key -> ServerConfig field
STDIO_ONLY_KEYS = ("args", "env", "cwd", "stderr_log_level")
HTTP_SPELLINGS = ("http", "streamableHttp", "streamable-http", "streamable_http", "shttp")
TRANSPORTS = {
    "stdio": "stdio",
    "sse": "sse",
    **{spelling.lower(): "http" for spelling in HTTP_SPELLINGS},
}
"""Accepted `transport` / `type` values, lower-cased (they compare case-insensitively)."""
TRANSPORT_HINT = (
    "must be stdio, sse or http (http may also be written streamableHttp, streamable-http, streamable_http or shttp)"
)
PROTOCOLS = ("auto", "legacy")
# `$${` is a literal `${`; `${NAME}` / `${NAME:-default}` are references; any other `${` is a mistake.
# `${input:ID}` is VS Code's prompt for a value, which the gateway cannot do.
_INTERPOLATION_RE = re.compile(r"\$\$\{|\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}|\$\{(input:[^}]*)\}|\$\{")

M = TypeVar("M", bound=BaseModel)


class Parser:
    """One parse: the file's key-path -> line index, the environment, and the error helpers."""

    def __init__(self, path: Path, environ: Mapping[str, str]) -> None:
        self.path = path
        self.folder = Path(os.path.abspath(path.expanduser())).parent
        """What relative paths in the file are relative to: never the gateway's current directory."""
        self.environ = environ
        self.lines: dict[KeyPath, int] = {}
        self.sections: dict[str, str] = {}  # server id -> the top-level key it is under (SERVER_SECTIONS)

    def line(self, key_path: KeyPath) -> int | None:
        """The line of the deepest part of `key_path` found in the file (missing keys: their parent's)."""
        for end in range(len(key_path), -1, -1):
            if key_path[:end] in self.lines:
                return self.lines[key_path[:end]]
        return None

    def error(self, key_path: KeyPath, message: str) -> ConfigError:
        return ConfigError(self.path, message, self.line(key_path), format_key(key_path) or None)

    def parse(self, text: str) -> GatewayConfig:
        loader: yaml.SafeLoader | None = None
        try:
            loader = yaml.SafeLoader(text)
            node = loader.get_single_node()
            if node is None:
                return GatewayConfig(path=self.path)
            self.lines[()] = node.start_mark.line + 1
            self._index(node, (), set(), set())
            data = loader.construct_document(node)
        except yaml.MarkedYAMLError as exc:
            raise self._yaml_error(exc) from None
        except yaml.reader.ReaderError as exc:  # a character YAML does not allow, e.g. NUL
            at = text.count("\n", 0, exc.position) + 1
            raise ConfigError(self.path, f"invalid YAML: {str(exc).splitlines()[0]}", at) from None
        finally:
            if loader is not None:
                loader.dispose()
        if data is None:
            return GatewayConfig(path=self.path)
        if not isinstance(data, dict):
            raise self.error((), "the file must be a mapping with a `mcps:` section")
        self._check_keys(data, (), TOP_LEVEL_KEYS)
        servers: dict[str, ServerConfig] = {}
        unusable: dict[str, UnusableServer] = {}
        for section in (key for key in data if key in SERVER_SECTIONS):
            for sid, raw in self._mapping(data[section], (section,), "server id to settings").items():
                if sid in servers or sid in unusable:
                    other = self.sections[sid]
                    line = self.line((other, sid))
                    raise self.error((section, sid), f"server {sid!r} is also defined under {other} (line {line})")
                self.sections[sid] = section
                try:
                    servers[sid] = self._server(section, sid, raw)
                except MissingVariable as missing:  # this server's problem only: the others are served
                    unusable[sid] = _unusable(sid, raw, missing)
        self._check_prefixes(servers)
        sections = dict(self._mapping(data.get("plugins"), ("plugins",), "plugin name to settings"))
        directories = self._plugin_directories(sections.pop(PLUGIN_DIRECTORIES_KEY, None))
        plugins = {
            name: self._interpolate(
                self._mapping(value, ("plugins", name), "setting to value"), ("plugins", name), False
            )
            for name, value in sections.items()
        }
        auth = self._section("auth", data, AuthConfig)
        if auth.jwt is not None and auth.jwt.jwks_file is not None:
            jwt = auth.jwt.model_copy(update={"jwks_file": self.folder / auth.jwt.jwks_file.expanduser()})
            auth = auth.model_copy(update={"jwt": jwt})
        security = self._section("security", data, SecurityConfig)
        config = GatewayConfig(
            path=self.path,
            servers=servers,
            unusable=unusable,
            plugins=plugins,
            plugin_directories=directories,
            auth=auth,
            security=security,
        )
        config._lines.update({key: line for key, line in self.lines.items() if key[:1] == ("plugins",)})
        return config

    def _plugin_directories(self, raw: Any) -> tuple[Path, ...]:
        """`plugins.directories`: a list of folders, relative to the file's folder."""
        if raw is None:
            return ()
        key = ("plugins", PLUGIN_DIRECTORIES_KEY)
        if not isinstance(raw, list) or not all(isinstance(item, str) and item for item in raw):
            raise self.error(key, "must be a list of folders (relative to this file's folder)")
        return tuple(self.folder / Path(item).expanduser() for item in raw)

    def _section(self, key: str, data: dict[str, Any], model: type[M]) -> M:
        """A top-level section (`auth:`, `security:`) validated, `${VAR}` expanded (e.g. key hashes)."""
        raw = self._interpolate(data.get(key) or {}, (key,), False)
        return validate_section(model, raw, (key,), self.path, self.line)

    def _yaml_error(self, exc: yaml.MarkedYAMLError) -> ConfigError:
        """PyYAML's problem and context, on the problem's (1-based) line."""
        mark = exc.problem_mark or exc.context_mark
        message = f"invalid YAML: {exc.problem or exc.context}"
        if exc.problem and exc.context:
            start = exc.context_mark
            on = f" started on line {start.line + 1}" if start and mark and start.line != mark.line else ""
            message += f" ({exc.context}{on})"
        if "'\\t'" in message:
            message += "; indent with spaces, not tabs"
        return ConfigError(self.path, message, mark.line + 1 if mark else None)

    def _index(self, node: yaml.Node, key_path: KeyPath, seen: set[int], inside: set[int]) -> None:
        """Record the line of every key path, make keys text and reject duplicates, before merges."""
        if id(node) in inside:
            raise self.error(key_path, "an alias refers to the collection that contains it")
        if id(node) in seen:  # an alias: already indexed where its anchor is
            return
        seen.add(id(node))
        inside.add(id(node))
        if isinstance(node, yaml.MappingNode):
            first_line: dict[str, int] = {}
            for key_node, value_node in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                line = key_node.start_mark.line + 1
                if isinstance(key_node, yaml.ScalarNode):
                    key_node.tag = "tag:yaml.org,2002:str"  # keys are names: `on:` or `8080:` stay text
                    ident = key_node.value
                    if ident in first_line:
                        message = f"duplicate key {key_node.value!r} (first defined on line {first_line[ident]})"
                        raise ConfigError(self.path, message, line, format_key((*key_path, key_node.value)))
                    first_line[ident] = line
                    child = (*key_path, key_node.value)
                    self.lines.setdefault(child, line)
                    self._index(value_node, child, seen, inside)
        elif isinstance(node, yaml.SequenceNode):
            for index, item in enumerate(node.value):
                self.lines.setdefault((*key_path, index), item.start_mark.line + 1)
                self._index(item, (*key_path, index), seen, inside)
        inside.discard(id(node))

    def _mapping(self, value: Any, key_path: KeyPath, what: str) -> dict[str, Any]:
        """`value` as a dict; an empty section (`key:` with nothing after it) counts as `{}`."""
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise self.error(key_path, f"must be a mapping of {what}")
        return value

    def _check_keys(self, data: dict[str, Any], key_path: KeyPath, known: tuple[str, ...]) -> None:
        for key in data:
            if key not in known:
                close = difflib.get_close_matches(key, known, n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else f"; known keys: {', '.join(known)}"
                raise self.error((*key_path, key), f"unknown key {key!r}{hint}")

    def _server(self, section: str, sid: str, raw: Any) -> ServerConfig:
        """Turn one `mcps:` / `mcpServers:` / `servers:` entry into a ServerConfig, or fail at the offending key."""
        base: KeyPath = (section, sid)
        if not SERVER_ID_RE.match(sid):
            message = "server id must start with a letter or digit and contain only letters, digits, '_', '.', '-'"
            raise self.error(base, message)
        if not isinstance(raw, dict):
            raise self.error(base, "must be a mapping of settings (e.g. `command:` or `url:`)")
        self._check_keys(raw, base, SERVER_KEYS if section == "mcps" else CLAUDE_KEYS)
        if isinstance(raw.get("tools"), dict):
            self._check_keys(raw["tools"], (*base, "tools"), TOOL_FILTER_KEYS)
        for one, other in (("transport", "type"), ("enabled", "disabled")):
            if one in raw and other in raw:
                raise self.error((*base, other), f"give either `{one}` or `{other}`, not both")

        values: dict[str, Any] = {}
        masked: dict[str, Any] = {}
        source: dict[str, str] = {}  # ServerConfig field -> the key it came from, for error paths
        for key, value in raw.items():
            if key == "credentials":
                continue
            value = self._interpolate(value, (*base, key), mask=False)
            if key == "auth" and isinstance(value, dict) and "client_secret_file" in value:
                value = self._client_secret_file(value, (*base, key))
            field: str = RENAMED_KEYS.get(key) or key
            source[field] = key
            values[field] = value
            display = self._interpolate(raw[key], (*base, key), mask=True)
            if display != value:
                masked[field] = display
        if "disabled" in raw:
            disabled = values["enabled"]
            if not isinstance(disabled, bool):
                raise self.error((*base, "disabled"), "must be true or false")
            values["enabled"] = not disabled

        transport = self._transport(values, base, source)
        if "protocol" in values and values["protocol"] not in PROTOCOLS:
            raise self.error((*base, "protocol"), f"must be one of {', '.join(PROTOCOLS)}")
        if transport == "stdio" and isinstance(values.get("cwd", ""), str):
            # Relative to the config's folder, which is also the default: never the gateway's own cwd.
            values["cwd"] = str(self.folder / Path(values.get("cwd", "")).expanduser())
        if transport == "stdio" and not values.get("args"):
            self._check_command(values["command"], values.get("cwd"), masked.get("command"), (*base, "command"))
        if "prefix" not in raw and (not PREFIX_RE.match(sid) or len(sid) > PREFIX_MAX):
            message = f"the id cannot be the tool prefix (max {PREFIX_MAX} of A-Z a-z 0-9 _ -); set `prefix:`"
            raise self.error(base, message)
        values.update(id=sid, transport=transport)
        for key in ("args", "env", "headers"):  # YAML users write `args: [--port, 8080]`
            if key in values:
                values[key] = _numbers_to_str(values[key])
        for key in STDIO_ONLY_KEYS if transport != "stdio" else ("headers",):
            if key in raw:
                kind = "stdio servers (with `command`)" if key != "headers" else "http/sse servers (with `url`)"
                raise self.error((*base, key), f"`{key}` only applies to {kind}")
        secrets = self._credentials(raw.get("credentials"), (*base, "credentials"))
        plain = "env" if transport == "stdio" else "headers"
        values["secret_" + plain] = secrets
        try:
            server = ServerConfig.model_validate(values)
        except ValidationError as exc:
            err = exc.errors()[0]
            loc = [part for part in err["loc"] if part != "[key]"]
            if loc:
                loc[0] = source.get(str(loc[0]), loc[0])
            message = err["msg"].removeprefix("Value error, ")
            raise self.error((*base, *loc), message[:1].lower() + message[1:]) from None
        fold = str if plain == "env" else str.lower  # header names are case-insensitive
        for name in secrets:
            if fold(name) in {fold(key) for key in getattr(server, plain)}:
                message = f"{name} is also set in `{plain}`; set it in one place"
                key = next(k for k in raw["credentials"] if k.rpartition("_")[0] == name)
                raise self.error((*base, "credentials", key), message)
        server._masked = masked
        return server

    def _transport(self, values: dict[str, Any], base: KeyPath, source: dict[str, str]) -> str:
        """stdio for `command`, http (or an explicit sse) for `url`; an explicit transport must agree."""
        has_command, has_url = "command" in values, "url" in values
        if has_command and has_url:
            raise self.error(base, "has both `command` and `url`; give one: `command` (stdio) or `url` (http/sse)")
        if not has_command and not has_url:
            raise self.error(base, "needs `command` (stdio) or `url` (http/sse)")
        given = values.get("transport")
        if given is None:
            return "stdio" if has_command else "sse" if _is_sse_url(values["url"]) else "http"
        key = (*base, source["transport"])
        if not isinstance(given, str) or given.lower() not in TRANSPORTS:
            raise self.error(key, TRANSPORT_HINT)
        transport = TRANSPORTS[given.lower()]
        if (transport == "stdio") != has_command:
            needs = "`command`" if transport == "stdio" else "`url`"
            has = "`command`" if has_command else "`url`"
            raise self.error(key, f"transport {transport} needs {needs}, but this server has {has}")
        return transport

    def _check_command(self, command: Any, cwd: Any, display: Any, key_path: KeyPath) -> None:
        """A `command` with spaces and no `args` is a whole command line: ask for it split, unless it is a file."""
        if not isinstance(command, str) or not any(char.isspace() for char in command.strip()):
            return
        if isinstance(cwd, str) and os.path.exists(os.path.join(cwd, command)):
            return  # e.g. "/Applications/My App/server"
        shown = command if display is None else display  # parts that came from ${VAR} show as ***
        if not any(char.isspace() for char in shown.strip()):
            message = "contains spaces after ${...} substitution; put the program in command and its arguments in args"
            raise self.error(key_path, message)
        try:
            program, *args = shlex.split(shown)
        except ValueError:  # unbalanced quotes
            program, *args = shown.split()
        message = (
            f'command "{shown}" contains spaces; put the program in command and its arguments in args, '
            f"e.g. command: {program}, args: {json.dumps(args)}"
        )
        raise self.error(key_path, message)

    def _credentials(self, raw: Any, key_path: KeyPath) -> dict[str, str]:
        """`NAME_env: VAR` -> {NAME: $VAR}, `NAME_file: PATH` -> {NAME: the file's text, stripped}:
        env vars for stdio servers, headers for http/sse ones. Relative paths start at the config's folder."""
        secrets: dict[str, str] = {}
        for key, source in self._mapping(raw, key_path, "`NAME_env: ENV_VAR` / `NAME_file: PATH` entries").items():
            at = (*key_path, key)
            name, _, kind = key.rpartition("_")
            if kind not in ("env", "file") or not name:
                raise self.error(at, "credential keys must be NAME_env or NAME_file (NAME is the env var or header)")
            if not isinstance(source, str) or not source:
                raise self.error(at, "must name an environment variable" if kind == "env" else "must be a file path")
            if kind == "env" and source not in self.environ:
                raise MissingVariable(self.path, f"environment variable {source} is not set", self.line(at),
                                      format_key(at))  # fmt: skip
            secrets[name] = self.environ[source] if kind == "env" else self._secret_file(source, at)
        return secrets

    def _client_secret_file(self, auth: dict[str, Any], at: KeyPath) -> dict[str, Any]:
        """`auth: {client_secret_file: PATH}` -> `client_secret` read from the file (relative to the config)."""
        source = auth["client_secret_file"]
        if "client_secret" in auth:
            raise self.error((*at, "client_secret_file"), "give either `client_secret` or `client_secret_file`")
        if not isinstance(source, str) or not source:
            raise self.error((*at, "client_secret_file"), "must be a file path")
        rest = {k: v for k, v in auth.items() if k != "client_secret_file"}
        return {**rest, "client_secret": self._secret_file(source, (*at, "client_secret_file"))}

    def _secret_file(self, source: str, at: KeyPath) -> str:
        path = (self.path.parent / Path(source).expanduser()).resolve()
        try:
            return path.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else "not readable UTF-8 text"
            raise self.error(at, f"cannot read the credential file {path}: {reason}") from None

    def _interpolate(self, value: Any, key_path: KeyPath, mask: bool) -> Any:
        """Expand `${VAR}` / `${VAR:-default}` in string values (never keys); `mask` shows `***` instead."""
        if isinstance(value, list):
            return [self._interpolate(item, (*key_path, i), mask) for i, item in enumerate(value)]
        if isinstance(value, dict):
            return {k: self._interpolate(v, (*key_path, k), mask) for k, v in value.items()}
        if not isinstance(value, str):
            return value

        def replace(match: re.Match[str]) -> str:
            text, name, default = match.group(0), match.group(1), match.group(2)
            if text == "$${":
                return "${"
            if match.group(3) is not None:
                message = (
                    f"{text} is a VS Code input, which the gateway does not support; "
                    "use an environment variable (${NAME}) or `credentials` instead"
                )
                raise self.error(key_path, message)
            if name is None:
                message = "invalid ${...} (use ${NAME} or ${NAME:-default}; write $${ for a literal ${)"
                raise self.error(key_path, message)
            found = self.environ.get(name)
            if not found and default is not None:
                found = default
            if found is None:
                message = f"environment variable {name} is not set (use ${{{name}:-default}} for a default)"
                raise MissingVariable(self.path, message, self.line(key_path), format_key(key_path) or None)
            return MASK if mask else found

        return _INTERPOLATION_RE.sub(replace, value)

    def _check_prefixes(self, servers: dict[str, ServerConfig]) -> None:
        owner: dict[str, ServerConfig] = {}
        for server in servers.values():
            if server.prefix and server.prefix in owner:
                first = owner[server.prefix]
                first_line = self.line((self.sections[first.id], first.id))
                message = (
                    f"prefix {server.prefix!r} is already used by server {first.id!r} (line {first_line}); "
                    "tool names would clash"
                )
                raise self.error((self.sections[server.id], server.id, "prefix"), message)
            owner[server.prefix] = server


def _unusable(sid: str, raw: dict[str, Any], missing: MissingVariable) -> UnusableServer:
    """What can be told of an entry that cannot be used: its id, prefix and kind, and why. (Its keys
    were checked before its values were expanded, so `raw` is a mapping of known keys.)"""
    prefix = raw.get("prefix")
    url = raw.get("url")
    declared = str(raw.get("transport") or raw.get("type") or "").lower()
    transport: Literal["stdio", "http", "sse"]
    if "command" in raw:
        transport = "stdio"
    elif declared == "sse" or (declared not in TRANSPORTS and _is_sse_url(url)):
        transport = "sse"
    else:
        transport = "http"
    enabled = raw.get("enabled", True) is not False and raw.get("disabled", False) is not True
    return UnusableServer(
        id=sid,
        prefix=prefix if isinstance(prefix, str) and "$" not in prefix else sid,
        transport=transport,
        enabled=enabled,
        reason=str(missing),
    )


def _is_sse_url(url: Any) -> bool:
    """An SSE endpoint conventionally ends in /sse (a trailing slash, query and fragment aside)."""
    try:
        return isinstance(url, str) and urlsplit(url).path.rstrip("/").endswith("/sse")
    except ValueError:  # e.g. a broken IPv6 host; the `url` check reports it
        return False


def _numbers_to_str(value: Any) -> Any:
    """Numbers in a list or mapping of strings become strings (booleans stay and fail validation)."""

    def convert(item: Any) -> Any:
        return str(item) if isinstance(item, int | float) and not isinstance(item, bool) else item

    if isinstance(value, list):
        return [convert(item) for item in value]
    if isinstance(value, dict):
        return {key: convert(item) for key, item in value.items()}
    return value
