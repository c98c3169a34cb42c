"""Keep the gateway from starting itself: the chain of gateways, and entries that would start this one.

A Claude Desktop `claude_desktop_config.json` can serve as the gateway's config, and it
usually lists the gateway too. Started as it is, that entry starts the gateway with the
same file, which starts it again, without end. Two guards stop it:

- Before a stdio entry is started, `starts_gateway` reads its command line (through
  `env`, `sh -c`, `npx`, `uvx`, `uv run`, `pipx run`, `python -m gateway`, the console
  script, the repository's `scripts/serve`) and finds the config the nested gateway
  would load. An entry whose config is this gateway's own, or one of the gateways'
  above it, is never started.
- Every stdio child gets `MCP_GATEWAY_CHAIN`: the config paths of the gateways above it,
  outermost first. A gateway that finds its own config in that chain (a wrapper script
  hid the loop), or as many gateways above it as the cap allows, refuses to start
  (`gateway_chain`). The cap in force goes down the chain too (`MCP_GATEWAY_MAX_NESTING`).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from dotenv import dotenv_values

__all__ = [
    "CAP_VAR",
    "CHAIN_VAR",
    "SELF_START",
    "TOO_DEEP",
    "Chain",
    "ChainError",
    "chain_problem",
    "config_identity",
    "gateway_chain",
    "inherited_cap",
    "inherited_chain",
    "is_refusal",
    "starts_gateway",
]

CHAIN_VAR = "MCP_GATEWAY_CHAIN"
"""Set for every stdio child: a JSON list of the config paths of the gateways above it, outermost first."""
CAP_VAR = "MCP_GATEWAY_MAX_NESTING"
"""Set for every stdio child: the nesting cap in force, which a gateway below may lower but not raise."""
SELF_START = "this entry starts the gateway itself"
TOO_DEEP = "too many gateways started one another"
DEFAULT_CONFIG = "external-mcps.yaml"  # the `config` setting's default, as the nested gateway would read it
CONFIG_ENV = "GATEWAY_CONFIG"
GATEWAY_PROGRAM = "mcp-gateway"
GATEWAY_MODULE = "gateway"
_MAX_HOPS = 8  # launchers inside launchers (`env` -> `sh -c` -> `uvx` ...) followed at most
_SCRIPT_HEAD = 8192  # bytes of a script read to recognise our console script

_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
_PYTHON = re.compile(r"^(python|pypy)(\d+(\.\d+)*)?w?$")
_CONSOLE_SCRIPT = re.compile(r"^\s*from gateway\.cli(\.main)? import main\b", re.MULTILINE)
_PYTHON_CODE = re.compile(r"\bfrom gateway(\.cli(\.main)?)? import\b|\bimport gateway\b")
_VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::?-([^}]*))?\}|\$([A-Za-z_][A-Za-z0-9_]*)")
_VERSION = re.compile(r"(?<=.)(@|==|>=|~=)[^@]*$|\[[^\]]*\]")  # mcp-gateway@0.1, mcp-gateway[x]==0.1
_SHELLS = frozenset({"sh", "bash", "dash", "zsh", "ksh", "ash"})
_SKIPPED = frozenset({"exec", "nohup", "command", "time"})  # words that run the rest as it is
_SHELL_OPERATORS = frozenset({";", "&&", "||", "|", "&", "(", ")"})
_REDIRECTIONS = frozenset({">", ">>", "<", ">&", "<&", "&>", "<<", "<<<"})

_PYTHON_VALUE_OPTIONS = frozenset({"-W", "-X", "--check-hash-based-pycs"})
_ENV_VALUE_OPTIONS = frozenset({"-u", "--unset", "-C", "--chdir", "-S", "--split-string"})
_NPX_VALUE_OPTIONS = frozenset({"-p", "--package", "--cache", "--registry", "--userconfig", "-w", "--workspace"})
_PIPX_VALUE_OPTIONS = frozenset({"--spec", "--python", "--pip-args", "--index-url", "-i"})
_UV_VALUE_OPTIONS = frozenset(
    {
        "--from", "--with", "--with-editable", "--with-requirements", "-p", "--python", "--index",
        "--default-index", "-i", "--index-url", "--extra-index-url", "-f", "--find-links", "-c", "--constraints",
        "--overrides", "-b", "--build-constraints", "--cache-dir", "--config-file", "--directory", "--project",
        "--env-file", "--extra", "--group", "--only-group", "--no-group", "--package", "--color",
        "--python-preference", "--resolution", "--prerelease", "-P", "--upgrade-package", "--reinstall-package",
        "--refresh-package", "--exclude-newer", "--keyring-provider", "--index-strategy", "--link-mode",
        "-C", "--config-setting", "--no-binary-package", "--no-build-package", "--allow-insecure-host",
    }
)  # fmt: skip


class ChainError(ValueError):
    """This gateway must not start: its chain says so, or the chain's environment variables are malformed."""


@dataclass(frozen=True)
class _Gateway:
    """A recognised invocation of this gateway: its own arguments, environment and working directory."""

    args: tuple[str, ...]
    env: Mapping[str, str]
    cwd: Path


def config_identity(path: str | os.PathLike[str], cwd: str | os.PathLike[str] | None = None) -> str:
    """A config path as one string per file: absolute (from `cwd`), symlinks resolved."""
    return str(Path(cwd if cwd is not None else os.getcwd(), path).resolve())


def inherited_chain(environ: Mapping[str, str] | None = None) -> list[str]:
    """The config paths of the gateways that started this one, outermost first (none: started by a person)."""
    raw = (os.environ if environ is None else environ).get(CHAIN_VAR, "")
    if not raw.strip():
        return []
    try:
        chain = json.loads(raw)
    except ValueError:
        chain = None
    if not isinstance(chain, list) or not all(isinstance(item, str) for item in chain):
        raise ChainError(f"{CHAIN_VAR} must be a JSON list of config paths (a gateway sets it), got {raw[:80]!r}")
    return chain


def inherited_cap(environ: Mapping[str, str] | None = None) -> int | None:
    """The nesting cap of the gateways above this one (a nested gateway may lower it, never raise it)."""
    raw = (os.environ if environ is None else environ).get(CAP_VAR, "").strip()
    if not raw:
        return None
    if not raw.isdigit() or int(raw) < 1:
        raise ChainError(f"{CAP_VAR} must be a whole number of at least 1 (a gateway sets it), got {raw[:20]!r}")
    return int(raw)


def chain_problem(own: str, chain: Sequence[str], max_nesting: int) -> str | None:
    """Why a gateway with config `own` under `chain` must not start, or None when it may."""
    shown = " -> ".join([*chain, own])
    if own in chain:
        return (
            f"{SELF_START}: its config {own} is already served by a gateway that started this one "
            f"(the chain of gateways: {shown}); remove the entry that starts the gateway from that config"
        )
    if len(chain) >= max_nesting:
        return (
            f"{TOO_DEEP}: this one would be number {len(chain) + 1} in the chain {shown}; "
            f"the most is {max_nesting} (GATEWAY_MAX_NESTING)"
        )
    return None


@dataclass(frozen=True)
class Chain:
    """This gateway's place among gateways that start one another."""

    configs: tuple[str, ...]
    """The config paths of the gateways above this one, outermost first, then its own."""
    max_nesting: int
    """The cap in force: this gateway's setting, or a lower one from the gateways above."""

    def child_env(self) -> dict[str, str]:
        """What every stdio child gets, so that a gateway among them knows its place."""
        return {CHAIN_VAR: json.dumps(list(self.configs)), CAP_VAR: str(self.max_nesting)}


def gateway_chain(config: str | os.PathLike[str], max_nesting: int, environ: Mapping[str, str] | None = None) -> Chain:
    """This gateway's chain, read from the environment its parent gave it.

    Raises `ChainError` when it must not start: its config is already in the chain (a
    gateway started itself, e.g. through a wrapper script), or the chain is at the cap.
    """
    inherited = inherited_chain(environ)
    cap = min(max_nesting, inherited_cap(environ) or max_nesting)
    own = config_identity(config)
    problem = chain_problem(own, inherited, cap)
    if problem is not None:
        raise ChainError(problem)
    return Chain((*inherited, own), cap)


def is_refusal(reason: str | None) -> bool:
    """Whether a failure reason says a gateway refused to start for its chain (retrying cannot help)."""
    return reason is not None and (SELF_START in reason or TOO_DEEP in reason)


def starts_gateway(
    command: str,
    args: Sequence[str],
    env: Mapping[str, str],
    cwd: str | os.PathLike[str] | None,
    chain: Sequence[str],
) -> str | None:
    """Why a stdio entry must not start, when it would start a gateway whose config is in `chain`, else None.

    `chain` ends with this gateway's own config; `env` is the child's whole environment
    and `cwd` its working directory (None: ours), as the child would get them.
    """
    start = Path(os.getcwd(), cwd) if cwd is not None else Path(os.getcwd())
    gateway = _invocation([command, *args], dict(env), start, 0)
    if gateway is None:
        return None
    config = _config_of(gateway)
    if config not in chain:
        return None
    whose = "this gateway's own config" if config == chain[-1] else "the config of a gateway that started this one"
    return f"{SELF_START}: it runs the gateway with {config}, {whose}; remove this entry from the config"


# ---- reading a command line ---------------------------------------------------


def _invocation(words: Sequence[str], env: dict[str, str], cwd: Path, hops: int) -> _Gateway | None:
    """The gateway that `words` would run (through any launchers), or None."""
    words = list(words)
    while words and _ASSIGNMENT.match(words[0]):  # `NAME=value command ...`
        env = {**env, **_assignments(words[:1])}
        words.pop(0)
    if not words or hops > _MAX_HOPS:
        return None
    command, rest = words[0], words[1:]
    name = _program_name(command)
    if name == GATEWAY_PROGRAM:
        return _Gateway(tuple(rest), env, cwd)
    if name in _SKIPPED:
        return _invocation(rest[1:] if rest[:1] == ["-p"] else rest, env, cwd, hops + 1)
    if name == "env":
        return _env(rest, env, cwd, hops + 1)
    if name in _SHELLS:
        return _shell(rest, env, cwd, hops + 1)
    if _PYTHON.match(name):
        return _python(rest, env, cwd, hops + 1)
    if name in ("npx", "pnpx", "bunx") or (name in ("npm", "pnpm", "yarn") and rest[:1] in (["exec"], ["dlx"])):
        return _npx(rest if name in ("npx", "pnpx", "bunx") else rest[1:], env, cwd, hops + 1)
    if name == "uvx" or (name == "uv" and rest[:2] == ["tool", "run"]):
        return _runner(rest if name == "uvx" else rest[2:], _UV_VALUE_OPTIONS, env, cwd, hops + 1)
    if name == "uv" and rest[:1] == ["run"]:
        return _uv_run(rest[1:], env, cwd, hops + 1)
    if name == "pipx" and rest[:1] == ["run"]:
        return _runner(rest[1:], _PIPX_VALUE_OPTIONS, env, cwd, hops + 1)
    path = _locate(command, env, cwd)
    if path is None:
        return None
    if _is_serve_script(path):  # scripts/serve: `cd` to the repository, `--config ${GATEWAY_CONFIG:-...} serve`
        root = path.resolve().parent.parent  # a symlink to the script runs from the real repository
        return _Gateway(("--config", _lookup(env, CONFIG_ENV) or DEFAULT_CONFIG, "serve", *rest), env, root)
    if _is_console_script(path):
        return _Gateway(tuple(rest), env, cwd)
    return None


def _program_name(command: str) -> str:
    name = command.replace("\\", "/").rsplit("/", 1)[-1].lower()
    for suffix in (".exe", ".cmd", ".bat"):
        name = name.removesuffix(suffix)
    return name


def _options(words: Sequence[str], with_value: frozenset[str]) -> tuple[dict[str, str], list[str]]:
    """Leading options (`--opt value`, `--opt=value`, flags) and the words from the first positional on."""
    seen: dict[str, str] = {}
    index = 0
    while index < len(words):
        word = words[index]
        if word == "--":
            return seen, list(words[index + 1 :])
        if not word.startswith("-") or word == "-":
            break
        option, equals, value = word.partition("=")
        if option in with_value and not equals:
            index += 1
            value = words[index] if index < len(words) else ""
        seen[option] = value
        index += 1
    return seen, list(words[index:])


def _env(words: Sequence[str], env: dict[str, str], cwd: Path, hops: int) -> _Gateway | None:
    """`env [-i] [-u NAME] [-C DIR] [NAME=value ...] command ...`."""
    index = 0
    while index < len(words) and words[index].startswith("-") and words[index] != "--":
        option, equals, value = words[index].partition("=")
        if option in _ENV_VALUE_OPTIONS and not equals:
            index += 1
            value = words[index] if index < len(words) else ""
        if option in ("-i", "--ignore-environment", "-"):
            env = {}
        elif option in ("-u", "--unset"):
            env = {k: v for k, v in env.items() if k != value}
        elif option in ("-C", "--chdir"):
            cwd = cwd / value
        elif option in ("-S", "--split-string"):
            return _invocation([*_split(value), *words[index + 1 :]], env, cwd, hops)
        index += 1
    rest = words[index + 1 :] if words[index : index + 1] == ["--"] else words[index:]
    return _invocation(rest, env, cwd, hops)


def _shell(words: Sequence[str], env: dict[str, str], cwd: Path, hops: int) -> _Gateway | None:
    """`sh -c 'command line'` (also `-lc`, `-ec`...); a script file run by a shell is judged as a command."""
    index = 0
    while index < len(words) and words[index][:1] in ("-", "+") and words[index] not in ("-", "--"):
        word = words[index]
        if word[:1] == "-" and not word.startswith("--") and "c" in word:
            return _shell_line(words[index + 1], env, cwd, hops) if index + 1 < len(words) else None
        index += 2 if word in ("-o", "+o", "-O", "+O") else 1
    index += words[index : index + 1] in (["-"], ["--"])
    if index >= len(words):
        return None
    script = words[index] if "/" in words[index] else "./" + words[index]  # a script path, not a PATH lookup
    return _invocation([script, *words[index + 1 :]], env, cwd, hops)


def _shell_line(script: str, env: dict[str, str], cwd: Path, hops: int) -> _Gateway | None:
    """Each simple command of a shell command line, in order; `cd` and `export` carry over to the next."""
    for line in script.splitlines():
        for words in _simple_commands(line):
            words = [_expand(word, env) for word in words]
            if words[:1] == ["cd"]:
                cwd = cwd / (words[1] if len(words) > 1 else env.get("HOME", "/"))
                continue
            if words[:1] == ["export"] or all(_ASSIGNMENT.match(word) for word in words):
                env = {**env, **_assignments(words)}
                continue
            found = _invocation(words, env, cwd, hops)
            if found is not None:
                return found
    return None


def _assignments(words: Sequence[str]) -> dict[str, str]:
    """The `NAME=value` words, as a mapping."""
    pairs = (word.partition("=") for word in words if _ASSIGNMENT.match(word))
    return {name: value for name, _, value in pairs}


def _simple_commands(line: str) -> list[list[str]]:
    """`a x && b y; c` -> [[a, x], [b, y], [c]], redirections dropped; [] when the quotes do not balance."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    commands: list[list[str]] = [[]]
    try:
        tokens = list(lexer)
    except ValueError:
        return []
    skip = False
    for token in tokens:
        if skip:
            skip = False
        elif token in _SHELL_OPERATORS:
            commands.append([])
        elif token in _REDIRECTIONS:
            skip = True
        else:
            commands[-1].append(token)
    return [words for words in commands if words]


def _split(text: str) -> list[str]:
    try:
        return shlex.split(text)
    except ValueError:
        return text.split()


def _expand(word: str, env: Mapping[str, str]) -> str:
    """`$NAME`, `${NAME}`, `${NAME:-default}` and a leading `~` (of the word or an assignment's value),
    as the shell would (unset: empty)."""

    def value(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(3)
        found = env.get(name, "")
        return found or (match.group(2) or "")

    word = _VARIABLE.sub(value, word)
    name, equals, rest = word.partition("=") if _ASSIGNMENT.match(word) else ("", "", word)
    if rest == "~" or rest.startswith("~/"):  # also `NAME=~/...`, as in an assignment
        rest = env.get("HOME", "~") + rest[1:]
    return name + equals + rest


def _python(words: Sequence[str], env: dict[str, str], cwd: Path, hops: int) -> _Gateway | None:
    """`python [options] -m gateway ...`, `python -c '...gateway.cli...' ...`, `python <console script> ...`."""
    index = 0
    while index < len(words):
        word = words[index]
        if word in ("-m", "-c") or (word[:2] in ("-m", "-c") and len(word) > 2):
            flag, attached = word[:2], word[2:]
            if not attached:
                index += 1
                attached = words[index] if index < len(words) else ""
            rest = tuple(words[index + 1 :])
            if flag == "-m":
                return _Gateway(rest, env, cwd) if attached == GATEWAY_MODULE else None
            return _Gateway(rest, env, cwd) if _PYTHON_CODE.search(attached) else None
        if not word.startswith("-") or word in ("-", "--"):
            break
        index += 2 if word in _PYTHON_VALUE_OPTIONS else 1
    index += words[index : index + 1] == ["--"]
    if index >= len(words):
        return None
    path = _locate(words[index], env, cwd, search=False)
    return _Gateway(tuple(words[index + 1 :]), env, cwd) if path is not None and _is_console_script(path) else None


def _npx(words: Sequence[str], env: dict[str, str], cwd: Path, hops: int) -> _Gateway | None:
    """`npx [-y] [-p package] command ...`, `npx -c 'command line'`."""
    seen, rest = _options(words, _NPX_VALUE_OPTIONS | {"-c", "--call"})
    call = seen.get("-c", seen.get("--call"))
    if call:
        return _shell_line(call, env, cwd, hops)
    return _invocation([_without_version(rest[0]), *rest[1:]], env, cwd, hops) if rest else None


def _runner(
    words: Sequence[str], with_value: frozenset[str], env: dict[str, str], cwd: Path, hops: int
) -> _Gateway | None:
    """`uvx [options] mcp-gateway[@version] ...`, `pipx run [--spec X] mcp-gateway ...`."""
    _, rest = _options(words, with_value)
    return _invocation([_without_version(rest[0]), *rest[1:]], env, cwd, hops) if rest else None


def _uv_run(words: Sequence[str], env: dict[str, str], cwd: Path, hops: int) -> _Gateway | None:
    """`uv run [--directory D] [-m module | command] ...`."""
    seen, rest = _options(words, _UV_VALUE_OPTIONS)
    if "--directory" in seen:
        cwd = cwd / seen["--directory"]
    if "-m" in seen or "--module" in seen:
        return _Gateway(tuple(rest[1:]), env, cwd) if rest[:1] == [GATEWAY_MODULE] else None
    return _invocation(rest, env, cwd, hops)


def _without_version(package: str) -> str:
    """`mcp-gateway@0.1.0` / `mcp-gateway==0.1` / `mcp-gateway[x]` -> `mcp-gateway`."""
    return _VERSION.sub("", package)


def _locate(command: str, env: Mapping[str, str], cwd: Path, *, search: bool = True) -> Path | None:
    """The file a command runs: a path (from the child's working directory) or a name on its PATH."""
    if "/" in command or not search:
        path = cwd / Path(command).expanduser()
        return path if path.is_file() else None
    found = shutil.which(command, path=env.get("PATH", os.defpath))
    return Path(found) if found else None


def _head(path: Path) -> str:
    try:
        with path.open("rb") as file:
            return file.read(_SCRIPT_HEAD).decode("utf-8", errors="replace")
    except OSError:
        return ""


def _is_console_script(path: Path) -> bool:
    """pip's / uv's `mcp-gateway` launcher (under any name), or the package's `__main__.py`."""
    return bool(_CONSOLE_SCRIPT.search(_head(path)))


def _is_serve_script(path: Path) -> bool:
    """The repository's `scripts/serve`, which runs the gateway from the repository's root."""
    real = path.resolve()
    return (
        real.name == "serve"
        and real.parent.name == "scripts"
        and (real.parent.parent / "gateway" / "cli" / "main.py").is_file()
    )


def _lookup(env: Mapping[str, str], name: str) -> str | None:
    """An environment variable as the gateway's settings read it: the name in any case."""
    folded = {key.upper(): value for key, value in env.items()}
    return folded.get(name.upper())


def _config_of(gateway: _Gateway) -> str:
    """The config the gateway would load: `--config` (or `-c`), else GATEWAY_CONFIG (env, then `.env`), else
    the default; the last `--config` wins, as with argparse."""
    value: str | None = None
    args = list(gateway.args)
    for index, word in enumerate(args):
        if word == "--":
            break
        option, equals, attached = word.partition("=")
        if option == "-c" or (option.startswith("--c") and "--config".startswith(option)):
            if equals:
                value = attached
            elif index + 1 < len(args):
                value = args[index + 1]
        elif word.startswith("-c") and len(word) > 2:
            value = word[2:]
    if value is None:
        value = _lookup(gateway.env, CONFIG_ENV)
    if value is None:
        dotenv = gateway.cwd / ".env"
        if dotenv.is_file():
            value = _lookup({k: v for k, v in dotenv_values(dotenv).items() if v is not None}, CONFIG_ENV)
    return config_identity(value or DEFAULT_CONFIG, gateway.cwd)
