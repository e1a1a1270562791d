"""The operator's documents name only what exists: README.md and docs/*.md against the code.

Why: the project's rule is "documentation that matches the code", and the README is what a new operator
reads first. Three kinds of claim are checked, each read from the documents themselves (so a claim added
later is checked too, and a renamed key, flag or target fails here instead of on an operator's machine):

* every configuration key the documents write in backticks (``server.max_body_bytes``) exists in the
  ``calculet-scheduler/v1`` model, and a default they state beside it (``monitoring.sample_every: 256``,
  ``server.header_timeout_s`` 10 s, ``server.max_body_bytes`` (8 MiB, ...) is the model's default;
* every command they show (``python -m calculet.X``, ``calculet X``, ``python bench/X.py``) reaches a
  real parser: each subcommand word is a subcommand, each ``--flag`` an option of it, each value shown for
  a flag with choices (``--sim-cost tiny|reference|instant|null``) one of its choices;
* every ``make TARGET`` is a target of the Makefile.

The parsers are the commands' own: each command's ``main`` is called with argparse's ``parse_known_args``
replaced by a capture, so nothing runs beyond building the parser (no server, no bench).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import inspect
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from calculet.cli import COMMANDS
from calculet.config import SchedulerConfig, default_config

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = ("README.md", "docs/devices.md", "docs/estimator.md", "docs/host_path.md")
UNITS = {"s": 1, "ms": 1, "B/s": 1, "KiB": 1024, "MiB": 1024 * 1024}
"""A stated default's unit → the factor to the field's own unit (the key's name carries it: ``_s``, ``_ms``,
``_bytes``); a default is written in the field's unit or, for byte sizes, in KiB/MiB."""


def _text(name: str) -> str:
    """A document with every line break and its indentation read as one space (a claim may wrap)."""
    return re.sub(r"\s*\n\s*", " ", (ROOT / name).read_text())


def _resolve(path: str, model: Any = SchedulerConfig) -> bool:
    """Whether ``a.b.c`` names a field of the configuration model, section by section."""
    head, _, rest = path.partition(".")
    fields = getattr(model, "model_fields", {})
    if head not in fields:
        return False
    return not rest or _resolve(rest, fields[head].annotation)


def _default(path: str) -> Any:
    value: Any = default_config()
    for part in path.split("."):
        value = getattr(value, part)
    return value


def config_claims(text: str) -> Iterator[tuple[str, str | None]]:
    """(key, stated default or None) for each backticked configuration key of ``text``."""
    sections = "|".join(SchedulerConfig.model_fields)
    key = rf"(?:{sections})(?:\.[a-z_0-9]+)+"
    for m in re.finditer(rf"`({key})(?::\s*([^`]+))?`(?:\s*\(?(\d+(?:\.\d+)?)\s?(s|ms|B/s|KiB|MiB)\b)?", text):
        path, yaml_value, number, unit = m.groups()
        if yaml_value is not None:
            yield path, yaml_value
        elif number is not None:
            yield path, f"{number} {unit}"
        else:
            yield path, None


def _stated(value: str) -> Any:
    number, _, unit = value.partition(" ")
    if unit in UNITS and re.fullmatch(r"\d+(?:\.\d+)?", number):
        return float(number) * UNITS[unit]
    return yaml.safe_load(value)


def test_every_configuration_key_the_documents_name_exists_with_its_stated_default() -> None:
    claims = [(doc, key, stated) for doc in DOCUMENTS for key, stated in config_claims(_text(doc))]
    assert len(claims) >= 15, "the documents name the keys an operator sets; fewer found: the pattern broke"
    unknown = [(doc, key) for doc, key, _ in claims if not _resolve(key)]
    assert not unknown, f"keys the documents name that the configuration does not have: {unknown}"
    wrong = [(doc, key, stated, _default(key)) for doc, key, stated in claims
             if stated is not None and _stated(stated) != _default(key)]
    assert not wrong, f"stated defaults that are not the configuration's (doc, key, stated, default): {wrong}"
    assert sum(stated is not None for _, _, stated in claims) >= 7, "the stated defaults are no longer found"


# --------------------------------------------------------------------------------------------------------
# Commands
# --------------------------------------------------------------------------------------------------------

PROGRAM = re.compile(r"^(?:python -m (calculet(?:\.[a-z_]+)*)|calculet ([a-z]+)|(?:python )?(bench/[a-z_]+\.py))\b")


def command_lines(text: str) -> Iterator[str]:
    """The commands a document shows: each line of a shell block (continuations joined, comments cut) and each
    inline code span that starts with a program."""
    for block in re.findall(r"```sh\n(.*?)```", text, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split("#", 1)[0].strip()
            if PROGRAM.match(line):
                yield line
    for span in re.findall(r"`([^`\n]+)`", re.sub(r"\s*\n\s*", " ", re.sub(r"```.*?```", "", text, flags=re.S))):
        if PROGRAM.match(span):
            yield span


class _Captured(Exception):
    def __init__(self, parser: argparse.ArgumentParser) -> None:
        super().__init__(parser.prog)
        self.parser = parser


def _entry(line: str, monkeypatch: pytest.MonkeyPatch) -> tuple[Callable[[list[str]], Any], list[str]]:
    """The ``main`` a command line runs and the words after the program."""
    m = PROGRAM.match(line)
    assert m is not None
    module, command, script = m.groups()
    words = line[m.end():].split()
    if command is not None:
        assert command in COMMANDS, f"{line!r}: `calculet {command}` is not a command"
        return COMMANDS[command].load(), words
    if script is not None:
        monkeypatch.syspath_prepend(str(ROOT / "bench"))  # a bench script imports its siblings
        spec = importlib.util.spec_from_file_location(f"_readme_{Path(script).stem}", ROOT / script)
        assert spec is not None and spec.loader is not None, f"{line!r}: no {script}"
        loaded = importlib.util.module_from_spec(spec)
        monkeypatch.setitem(sys.modules, spec.name, loaded)  # its dataclasses look their module up
        spec.loader.exec_module(loaded)
        return loaded.main, words
    assert module is not None
    target = importlib.import_module(module)
    if hasattr(target, "__path__"):  # a package: python -m runs its __main__
        target = importlib.import_module(f"{module}.__main__")
    return target.main, words


def _parser(main: Callable[[list[str]], Any], monkeypatch: pytest.MonkeyPatch) -> argparse.ArgumentParser:
    def capture(self: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> Any:
        raise _Captured(self)

    with monkeypatch.context() as patch:
        patch.setattr(argparse.ArgumentParser, "parse_known_args", capture)
        patch.setattr(sys, "argv", [main.__module__])
        try:
            main(*([[]] if inspect.signature(main).parameters else []))
        except _Captured as captured:
            return captured.parser
    raise AssertionError(f"{main.__module__}.main parsed no arguments")


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def check_command(line: str, parser: argparse.ArgumentParser) -> list[str]:
    """What in ``line`` the parser does not have: unknown subcommands, options, or values outside a choice."""
    problems: list[str] = []
    words = [w.strip("[]") for w in line.split()]
    pending: argparse.Action | None = None
    for word in words:
        if not word:
            continue
        if word.startswith("--"):
            flag = word.split("=", 1)[0]
            pending = parser._option_string_actions.get(flag)
            if pending is None:
                problems.append(f"{flag} is not an option of {parser.prog!r}")
            continue
        action, pending = pending, None
        if action is not None and action.choices is not None and action.nargs is None:
            problems += [f"{action.option_strings[0]} {v}: not one of {sorted(action.choices)}"
                         for v in word.split("|") if v not in action.choices]
            continue
        subcommands = _subcommands(parser)
        if subcommands and action is None:
            names = word.split("|")
            if all(n in subcommands for n in names):
                parser = subcommands[names[0]]
            elif len(names) > 1 or re.fullmatch(r"[a-z][a-z-]*", word):
                problems.append(f"{word!r} is not a subcommand of {parser.prog!r} ({sorted(subcommands)})")
    return problems


def _commands() -> list[str]:
    return sorted({line for doc in DOCUMENTS for line in command_lines((ROOT / doc).read_text())})


def test_the_documents_show_commands() -> None:
    lines = _commands()
    assert len(lines) >= 15, lines
    assert any(line.startswith("python -m calculet.run [--config FILE]") for line in lines), lines


@pytest.mark.parametrize("line", _commands())
def test_every_command_the_documents_show_parses(line: str, monkeypatch: pytest.MonkeyPatch) -> None:
    main, words = _entry(line, monkeypatch)
    problems = check_command(" ".join(words), _parser(main, monkeypatch))
    assert not problems, f"{line!r}: {problems}"


def test_every_make_target_the_documents_name_exists() -> None:
    targets = set(re.findall(r"^([a-z][a-z-]*):", (ROOT / "Makefile").read_text(), re.M))
    named = {t for doc in DOCUMENTS  # in code only (`make run`, a shell line): prose says "make it"
             for t in re.findall(r"(?:`|^)make ([a-z][a-z-]*)\b", (ROOT / doc).read_text(), re.M)}
    assert {"run", "test", "verify", "bench"} <= named, named
    assert named <= targets, f"make targets the documents name that the Makefile lacks: {named - targets}"
