"""Every subcommand's help shows its defaults in plain text; bad values name their flag."""

from __future__ import annotations

import argparse

import pytest

from moriio.cli import main as cli_main

COMMANDS = ("demo", "bench", "doctor", "plan", "router")


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    tools = {name: cli_main.load_tool(name) for name in cli_main.TOOL_COMMANDS}
    parser = cli_main.build_parser(tools)
    [sub] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return {name: sub.choices[name] for name in COMMANDS}


def _option_help(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    formatter = parser._get_formatter()
    formatter.add_argument(action)
    return " ".join(formatter.format_help().split())


@pytest.mark.parametrize("command", COMMANDS)
def test_every_option_with_a_default_shows_it(command: str) -> None:
    parser = _subparsers()[command]
    for action in parser._actions:
        if not action.option_strings or action.default in (None, False, "", argparse.SUPPRESS):
            continue
        assert "default" in _option_help(parser, action), (command, action.option_strings)


@pytest.mark.parametrize("command", COMMANDS)
def test_help_texts_have_no_markup_and_every_option_says_what_it_does(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        cli_main.main([command, "--help"])
    assert "`" not in capsys.readouterr().out
    parser = _subparsers()[command]
    if command == "doctor":
        return  # the fingerprint flags are named after the fingerprint's fields
    for action in parser._actions:
        assert action.help or not action.option_strings, (command, action.option_strings)


def test_the_bench_section_has_help() -> None:
    [section] = [a for a in _subparsers()["bench"]._actions if "--section" in a.option_strings]
    assert "planner" in (section.help or "")


def test_a_bad_concurrency_names_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli_main.main(["bench", "--e2e", "--vllm-bench", "--concurrency", "abc"])
    assert exit_info.value.code == 2
    assert "argument --concurrency: expected comma-separated whole numbers" in (
        capsys.readouterr().err
    )
    args = cli_main.build_parser({"bench": cli_main.load_tool("bench")}).parse_args(["bench"])
    assert args.concurrency == (1, 4, 16)
