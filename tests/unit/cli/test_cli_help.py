"""Every subcommand's ``--help`` has a description and one to three examples under ``examples:``, printed as
written: a new subcommand without them fails here (their text is in ``shardyard.cli.usage``)."""

from __future__ import annotations

import argparse

import pytest

from shardyard.cli import main


def subcommands() -> dict[str, argparse.ArgumentParser]:
    (commands,) = (a for a in main.parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(commands.choices)


@pytest.mark.parametrize("name", sorted(subcommands()))
def test_every_subcommand_has_a_description_and_examples(name: str) -> None:
    command = subcommands()[name]

    assert command.description and len(command.description.strip()) > 20, name
    assert command.epilog and command.epilog.startswith("examples:\n"), name
    examples = command.epilog.splitlines()[1:]
    assert 1 <= len(examples) <= 3, examples
    assert all(line.startswith(f"  shardyard {name}") or " | shardyard " in line for line in examples), examples
    assert issubclass(command.formatter_class, argparse.RawDescriptionHelpFormatter), name
    assert command.epilog in command.format_help()  # as written, not re-wrapped


def test_the_listings_spell_the_output_flag_as_history_does() -> None:
    commands = subcommands()
    for name in ("status", "jobs", "nodes", "alerts", "history", "ps"):
        (output,) = (a for a in commands[name]._actions if a.dest == "output" and a.option_strings[:1] == ["-o"])
        assert output.option_strings == ["-o", "--output"] and output.default == "table", name
    for name in ("status", "jobs", "nodes", "alerts"):
        assert commands[name].parse_args(["-o", "wide"]).output == "wide"
    assert commands["status"].parse_args(["--json"]).output == "json"  # the older spelling stays
    assert commands["alerts"].parse_args([]).output == "table"
