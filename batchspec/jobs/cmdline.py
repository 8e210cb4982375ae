"""The command line before Hydra sees it: flags may come after overrides, and no override may name a
key the schema lacks.

Hydra parses its command line with argparse, whose positional `overrides` are taken in one run: in
`job=demo -m drafter.k=2,4` the overrides after `-m` are "unrecognized arguments". `split_argv` moves
Hydra's flags (with their values) in front of the overrides, keeping each group's order, so the flags
may go anywhere. It asks Hydra's own parser which flags take a value.

Hydra lets `+key=value` add a key to a closed structured config, and OmegaConf.to_object then drops
it without a word; and its message for a misspelled `key=value` suggests exactly that `+` form.
`unknown_key` checks every override's key against the schema (JobConfig) first, so a misspelled key
fails the same way with or without `+`, naming the closest real key.
"""

from __future__ import annotations

import dataclasses
import difflib
import typing
from pathlib import Path

from hydra._internal.utils import get_args_parser
from hydra.core.override_parser.overrides_parser import OverridesParser

from .config import CONF_DIR, JobConfig

GROUPS = ("job",)  # config groups that are not folders of conf/ (job files are registered at start)


def split_argv(argv: list[str]) -> tuple[list[str], list[str]]:
    """(Hydra's flags with their values, the overrides), each in its order: Hydra parses flags + overrides."""
    actions = get_args_parser()._option_string_actions
    flags: list[str] = []
    overrides: list[str] = []
    i = 0
    while i < len(argv):
        token = argv[i]
        if token == "--":
            overrides += argv[i + 1:]
            break
        action = actions.get(token.split("=", 1)[0]) if token.startswith("-") else None
        if action is None or "=" in token:
            (flags if token.startswith("-") else overrides).append(token)
        elif action.nargs is None and i + 1 < len(argv):  # a flag with one value: --cfg job
            flags += argv[i:i + 2]
            i += 1
        elif action.nargs == "?" and i + 1 < len(argv) and argv[i + 1] in (action.choices or ()):  # --info config
            flags += argv[i:i + 2]
            i += 1
        else:
            flags.append(token)
        i += 1
    return flags, overrides


def config_groups() -> set[str]:
    return {p.name for p in Path(CONF_DIR).iterdir() if p.is_dir()} | set(GROUPS)


def unknown_key(overrides: list[str]) -> str | None:
    """The message for the first override whose key is not in the schema, or None (also when an
    override does not parse: Hydra then reports it in its own words)."""
    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except Exception:  # a syntax error: Hydra's own message is the better one
        return None
    groups = config_groups()
    for override in parsed:
        key = override.key_or_group
        if override.package is not None or key == "hydra" or key.startswith(("hydra.", "hydra/")):
            continue
        if key in groups or "/" in key:  # a group choice (drafter=ngram), not a key
            continue
        problem = schema_problem(key)
        if problem:
            plus = " ('+' cannot add keys: the schema is closed)" if override.is_add() or override.is_force_add() else ""
            return f"{problem}{plus}"
    return None


def schema_problem(key: str) -> str | None:
    """Why the dotted `key` is not a key of JobConfig, with the closest real key; None if it is one."""
    node: typing.Any = JobConfig
    parts = key.split(".")
    for depth, part in enumerate(parts):
        if not dataclasses.is_dataclass(node):
            if typing.get_origin(node) in (list, typing.List) and part.isdigit():
                return None  # an item of a list key, e.g. sampling.stop.0
            if typing.get_origin(node) in (dict, typing.Dict) and depth == len(parts) - 1:
                return None  # an entry of a mapping key, e.g. +source.row_params.max_new_tokens=max_tokens
            return f"unknown key {key!r}: {'.'.join(parts[:depth])} has no keys"
        hints = typing.get_type_hints(node)
        if part not in hints:
            prefix = ".".join(parts[:depth])
            close = difflib.get_close_matches(part, list(hints), n=1)
            hint = f" (did you mean {'.'.join(filter(None, [prefix, close[0]]))}?)" if close else ""
            where = f"the keys of {prefix}" if prefix else "the top-level keys"
            return f"unknown key {key!r}{hint}; {where} are {', '.join(hints)}"
        node = _unwrap_optional(hints[part])
    return None


def _unwrap_optional(t: typing.Any) -> typing.Any:
    args = [a for a in typing.get_args(t) if a is not type(None)]
    return args[0] if typing.get_origin(t) is typing.Union and len(args) == 1 else t


def job_file_problem(path: Path, node: typing.Any) -> str | None:
    """The first key of a job file (its loaded YAML) that the schema lacks, in the words `unknown_key` uses
    for the command line, with the file named; None when every key is one. Hydra would stop on it too, but
    with a ConfigKeyError of several lines."""

    def walk(mapping: typing.Any, prefix: str) -> str | None:
        for key in mapping:
            if not prefix and key in ("defaults", "hydra"):  # Hydra's own keys
                continue
            dotted = f"{prefix}.{key}" if prefix else str(key)
            problem = schema_problem(dotted)
            if problem:
                return problem
            value = mapping[key]
            if hasattr(value, "keys") and dataclasses.is_dataclass(_schema_at(dotted)):
                problem = walk(value, dotted)
                if problem:
                    return problem
        return None

    problem = walk(node, "") if hasattr(node, "keys") else None
    return f"{path}: {problem}" if problem else None


def _schema_at(key: str) -> typing.Any:
    node: typing.Any = JobConfig
    for part in key.split("."):
        node = _unwrap_optional(typing.get_type_hints(node)[part])
    return node
