"""docs/api.md and docs/cli.md are checked against the package, so neither can drift from it:

- every public ``fencepost.Ledger`` method has a ``### name`` section in docs/api.md with a
  signature naming exactly its parameters (in order, keyword-only where they are, with a
  default where they have one, the same default where it is a literal), and every signature
  there is a method that exists;
- every name in ``fencepost.__all__`` is mentioned, every record lists its fields and every
  error's row in the errors table lists its fields;
- every ``fencepost`` command has a ``## fencepost COMMAND`` section in docs/cli.md naming each
  of its options and arguments, and every such section is a command that exists.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import re
from typing import Any

import pytest

import fencepost as fp
from fencepost import cli
from tests.conftest import REPO

API = (REPO / "docs" / "api.md").read_text(encoding="utf-8")
CLI = (REPO / "docs" / "cli.md").read_text(encoding="utf-8")

# A signature block of a Ledger method: a ```text block that begins `name(` (or
# `Ledger.open(`); other signatures on the page are qualified (`fencepost.digest(`).
SIGNATURE = re.compile(r"```text\n(?:Ledger\.)?([a-z_]+)\((.*?)```", re.S)


def public_members(cls: type) -> dict[str, Any]:
    return {name: m for name, m in inspect.getmembers(cls) if not name.startswith("_")}


LEDGER = public_members(fp.Ledger)
METHODS = sorted(name for name, m in LEDGER.items() if not isinstance(m, property))
PROPERTIES = sorted(name for name, m in LEDGER.items() if isinstance(m, property))


def section(text: str, heading: str) -> str:
    """The text under ``heading`` (a whole heading line) up to the next heading of the same or
    a higher level."""
    level = len(heading) - len(heading.lstrip("#"))
    match = re.search(rf"^{re.escape(heading)}\n(.*?)(?=^#{{1,{level}}} |\Z)", text, re.M | re.S)
    assert match, f"no section {heading!r}"
    return match.group(1)


def documented_signatures() -> dict[str, list[ast.arguments]]:
    """Each Ledger signature on the page, parsed as the parameters of a ``def``."""
    found: dict[str, list[ast.arguments]] = {}
    for name, rest in SIGNATURE.findall(API):
        tree = ast.parse(f"def {name}({rest.rstrip()}: ...")
        [func] = tree.body
        assert isinstance(func, ast.FunctionDef)
        found.setdefault(name, []).append(func.args)
    return found


SIGNATURES = documented_signatures()


def test_every_documented_signature_is_a_ledger_method() -> None:
    assert set(SIGNATURES) - set(METHODS) == set()
    assert [name for name, sigs in SIGNATURES.items() if len(sigs) > 1] == []


@pytest.mark.parametrize("name", METHODS)
def test_each_method_has_a_section_and_its_signature(name: str) -> None:
    assert re.search(rf"^### {name}$", API, re.M), f"docs/api.md has no '### {name}'"
    assert name in SIGNATURES, f"docs/api.md has no signature block for {name}"
    [args] = SIGNATURES[name]
    documented = [(a, False) for a in args.posonlyargs + args.args]
    documented += [(a, True) for a in args.kwonlyargs]
    defaults: dict[str, ast.expr | None] = {}
    positional = args.posonlyargs + args.args
    for arg, default in zip(
        positional[len(positional) - len(args.defaults) :], args.defaults, strict=True
    ):
        defaults[arg.arg] = default
    for arg, kw_default in zip(args.kwonlyargs, args.kw_defaults, strict=True):
        if kw_default is not None:
            defaults[arg.arg] = kw_default

    params = [p for p in inspect.signature(LEDGER[name]).parameters.values() if p.name != "self"]
    assert [a.arg for a, _ in documented] == [p.name for p in params], name
    for (arg, keyword_only), p in zip(documented, params, strict=True):
        assert keyword_only == (p.kind is p.KEYWORD_ONLY), f"{name}({p.name}): keyword-only?"
        has_default = p.default is not p.empty
        assert (arg.arg in defaults) == has_default, f"{name}({p.name}): default?"
        if has_default and isinstance(p.default, int | float | str | bool | tuple | None):
            written = defaults[arg.arg]
            assert written is not None
            assert ast.literal_eval(written) == p.default, f"{name}({p.name}): default"


@pytest.mark.parametrize("name", PROPERTIES)
def test_each_property_has_a_section(name: str) -> None:
    assert re.search(rf"^### {name}$", API, re.M), f"docs/api.md has no '### {name}'"


@pytest.mark.parametrize("name", fp.__all__)
def test_every_exported_name_is_mentioned(name: str) -> None:
    in_code = rf"`[^`\n]*\b{re.escape(name)}\b[^`\n]*`"
    assert re.search(in_code, API) or re.search(rf"^#+ {re.escape(name)}$", API, re.M), name


RECORDS = [
    name
    for name in fp.__all__
    if inspect.isclass(getattr(fp, name)) and dataclasses.is_dataclass(getattr(fp, name))
]


@pytest.mark.parametrize("name", RECORDS)
def test_each_record_lists_its_fields(name: str) -> None:
    text = section(API, f"### {name}")
    for field in dataclasses.fields(getattr(fp, name)):
        assert f"`{field.name}`" in text, f"{name}.{field.name}"


ERRORS = [
    name
    for name in fp.__all__
    if inspect.isclass(getattr(fp, name)) and issubclass(getattr(fp, name), fp.LedgerError)
]


@pytest.mark.parametrize("name", ERRORS)
def test_each_error_row_lists_its_fields(name: str) -> None:
    [row] = re.findall(rf"^\| `{name}` \|.*$", API, re.M)
    cells = [c.strip() for c in row.strip("|").split("|")]
    init = inspect.signature(getattr(fp, name).__init__).parameters.values()
    fields = {p.name for p in init if p.kind is p.KEYWORD_ONLY}
    assert set(re.findall(r"`(\w+)`", cells[2])) == fields, name


# ------------------------------------------------------------------ the command line


def commands() -> dict[str, argparse.ArgumentParser]:
    [sub] = [a for a in cli.parser()._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(sub.choices)


def named(action: argparse.Action) -> str:
    """How the page names an argument: its longest option string, or its metavar."""
    if action.option_strings:
        return max(action.option_strings, key=len)
    return str(action.metavar or action.dest)


def test_every_cli_section_is_a_command() -> None:
    documented = re.findall(r"^## fencepost (\S+)$", CLI, re.M)
    assert sorted(documented) == sorted(commands())


@pytest.mark.parametrize("command", sorted(commands()))
def test_each_command_names_its_options(command: str) -> None:
    text = section(CLI, f"## fencepost {command}")
    for action in commands()[command]._actions:
        if isinstance(action, argparse._HelpAction) or action.help == argparse.SUPPRESS:
            continue
        assert re.search(rf"(?<![\w-]){re.escape(named(action))}(?![\w-])", text), (
            f"fencepost {command}: {named(action)}"
        )


def test_the_top_level_options_are_named() -> None:
    for action in cli.parser()._actions:
        if action.option_strings and not isinstance(action, argparse._HelpAction):
            assert named(action) in CLI
