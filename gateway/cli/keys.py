"""`mcp-gateway keys`: API keys for `auth.api_keys`, and their hashes."""

from __future__ import annotations

import argparse
import sys

from gateway.cli.common import EXIT_OK, Usage
from gateway.config.settings import Settings
from gateway.security.auth import MIN_KEY_LENGTH, hash_key, new_key

__all__ = ["add_parsers", "run_keys"]


def add_parsers(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    keys = commands.add_parser("keys", help="make API keys for `auth.api_keys` and hash existing ones")
    keys.add_argument("action", choices=["new", "hash"], help="new: a fresh key and its hash; hash: hash a key")
    keys.add_argument("key", nargs="?", help="hash: the key (default: read one line from stdin)")
    keys.set_defaults(run=run_keys)


def run_keys(args: argparse.Namespace, settings: Settings) -> int:
    return _keys(args.action, args.key)


def _keys(action: str, key: str | None) -> int:
    """`keys new` prints a fresh key and its hash; `keys hash` hashes a key (argument or stdin)."""
    if action == "new":
        key = new_key()
        print(f"key:  {key}\nhash: {hash_key(key)}")
        print("Give the key to its holder; put only the hash in auth.api_keys.", file=sys.stderr)
        return EXIT_OK
    key = (key if key is not None else sys.stdin.readline()).strip()
    if not key:
        raise Usage("keys hash needs a key (as an argument or one line on stdin)")
    if len(key) < MIN_KEY_LENGTH:
        print(f"warning: a key under {MIN_KEY_LENGTH} characters can be guessed; use `keys new`", file=sys.stderr)
    print(hash_key(key))
    return EXIT_OK
