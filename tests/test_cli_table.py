"""The ``envrl`` parser is built from one table (``envrl.cli.COMMANDS``), and its help reads the
registries: a row is a subcommand, a registered env or algorithm is in the help, and none of it
costs ``envrl --help`` an import of torch or of an env engine."""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
import types

import pytest

from envrl import cli
from envrl.envs import REGISTRY


def _subcommand(parser: argparse.ArgumentParser, path: tuple[str, ...]) -> argparse.ArgumentParser:
    """The parser of ``envrl <path>`` (KeyError when the path is not a subcommand)."""
    for name in path:
        (choices,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = choices.choices[name]
    return parser


def _leaf_paths(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()) -> set[tuple[str, ...]]:
    """Every path of the parser that runs something (not a group of subcommands)."""
    actions = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not actions:
        return {prefix}
    return {path for name, sub in actions[0].choices.items() for path in _leaf_paths(sub, (*prefix, name))}


def _help(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, *path: str) -> str:
    monkeypatch.setenv("COLUMNS", "10000")  # argparse wraps at a name's hyphen (diag-\nchain) otherwise
    assert cli.main([*path, "--help"]) == 0
    return capsys.readouterr().out


def test_every_row_is_a_subcommand_with_its_handler_and_nothing_else_is():
    parser = cli.build_parser()
    assert _leaf_paths(parser) == {command.path for command in cli.COMMANDS}
    for command in cli.COMMANDS:
        assert _subcommand(parser, command.path).get_default("handler") is command.handler, command.path
        assert callable(command.handler)


def test_every_lazily_named_function_exists():
    """A misspelt ``module:function`` would otherwise fail only when that command runs."""
    lazies = [f for c in cli.COMMANDS for f in (c.add_arguments, c.handler) if isinstance(f, cli.Lazy)]
    assert lazies
    for lazy in lazies:
        assert callable(lazy.resolve()), lazy.target


def test_a_row_added_to_the_table_is_parsed_and_dispatched():
    def add_arguments(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--count", type=int, default=1)

    def handler(args: argparse.Namespace) -> int:
        return args.count

    rows = (
        *cli.COMMANDS,
        cli.Command(("data", "extra"), "an extra dataset", add_arguments, handler),
        cli.Command(("extra",), "an extra command", add_arguments, handler),
    )
    parser = cli.build_parser(rows)
    args = parser.parse_args(["data", "extra", "--count", "3"])
    assert (args.command, args.dataset, args.handler(args)) == ("data", "extra", 3)
    args = parser.parse_args(["extra"])
    assert (args.command, args.handler(args)) == ("extra", 1)
    assert "an extra dataset" in _subcommand(parser, ("data",)).format_help()
    assert _leaf_paths(parser) == {row.path for row in rows}


def test_a_row_under_an_undeclared_group_is_refused_by_name():
    row = cli.Command(("tools", "lint"), "lint", lambda parser: None, lambda args: 0)
    with pytest.raises(ValueError, match="no group 'tools'"):
        cli.build_parser((*cli.COMMANDS, row))


def test_every_env_with_a_downloader_has_a_data_subcommand():
    with_downloader = [name for name, d in REGISTRY.items() if d.downloader]
    assert "alfworld" in with_downloader
    paths = {command.path for command in cli.COMMANDS}
    assert {("data", name) for name in with_downloader} <= paths


def test_a_registered_downloader_becomes_data_name(monkeypatch):
    """A new env's descriptor that names a downloader module gets ``envrl data <name>``, its
    arguments and its handler from that module, with no row written in cli.py."""
    module = types.ModuleType("toy_downloader")
    module.HELP = "the official toy games"
    module.add_arguments = lambda parser: parser.add_argument("--mirror", default="a")
    module.run = lambda args: 7 if args.mirror == "b" else 0
    monkeypatch.setitem(sys.modules, "toy_downloader", module)
    toy = dataclasses.replace(REGISTRY["diag-chain"], name="toy", env_id="envrl/Toy-v0", downloader="toy_downloader")
    registry = {**REGISTRY, "toy": toy}
    rows = cli.download_commands(registry)
    assert [row.path for row in rows] == [("data", "alfworld"), ("data", "toy")]
    parser = cli.build_parser((*(c for c in cli.COMMANDS if c.path[0] != "data"), *rows))
    args = parser.parse_args(["data", "toy", "--mirror", "b"])
    assert (args.dataset, args.handler(args)) == ("toy", 7)
    assert "the official toy games" in _subcommand(parser, ("data",)).format_help()


def test_a_downloader_module_missing_its_functions_is_refused_by_name(monkeypatch):
    monkeypatch.setitem(sys.modules, "half_downloader", types.ModuleType("half_downloader"))
    toy = dataclasses.replace(REGISTRY["diag-chain"], name="toy", env_id="envrl/Toy-v0", downloader="half_downloader")
    with pytest.raises(
        ValueError, match="^env 'toy': downloader module 'half_downloader' lacks HELP, add_arguments, run$"
    ):
        cli.download_commands({"toy": toy})


@pytest.mark.parametrize("command", ["eval", "train"])
def test_env_help_lists_every_registered_env(capsys, monkeypatch, command):
    text = _help(capsys, monkeypatch, command)
    missing = [name for name in REGISTRY if name not in text]
    assert not missing, f"envrl {command} --help does not name {missing}"


def test_train_help_lists_every_registered_algorithm(capsys, monkeypatch):
    pytest.importorskip("torch")
    from envrl.training.algorithms import ALGORITHMS

    text = _help(capsys, monkeypatch, "train")
    assert f"algorithms: {', '.join(ALGORITHMS)}" in text


def test_envrl_help_imports_no_torch_and_no_env_engine():
    """The algorithm registry imports torch and an engine's env module the engine: ``envrl --help``
    reads neither. (The diagnostic envs have no engine but themselves, pure Python.) Run in a
    fresh interpreter: this one may have imported both."""
    engines = [d for d in REGISTRY.values() if d.engine_packages]
    heavy = {"torch", "transformers"}
    heavy |= {package.replace("-", "_") for d in engines for package in d.engine_packages}
    heavy |= {d.entry_point.partition(":")[0] for d in engines}
    code = (
        "import contextlib, io, json, sys\n"
        "from envrl import cli\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    assert cli.main(['--help']) == 0\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    imported = set(json.loads(out))
    assert not heavy & imported, sorted(heavy & imported)
