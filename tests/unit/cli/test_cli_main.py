"""The ``moriio`` entry point: light import, subcommand dispatch, the demo stub."""

from __future__ import annotations

import json
import subprocess
import sys
from types import ModuleType

import pytest

from moriio.cli import main as cli_main

HEAVY = ("torch", "vllm", "zmq", "nixl_cu12", "mori", "msgpack", "matplotlib", "structlog")


def test_importing_the_command_and_building_its_parser_loads_no_heavy_module() -> None:
    code = (
        "import json, sys; import moriio.cli.main as m; m.build_parser(); "
        f"print(json.dumps([n for n in {HEAVY!r} if n in sys.modules]))"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    assert json.loads(out.stdout) == []


@pytest.mark.parametrize("command", ["demo", "bench", "doctor", "plan"])
def test_every_subcommand_has_help(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli_main.main([command, "--help"])
    assert exit_info.value.code == 0
    assert f"moriio {command}" in capsys.readouterr().out


def test_a_missing_command_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli_main.main([])
    assert exit_info.value.code == 2
    assert "COMMAND" in capsys.readouterr().err


def test_a_tool_command_without_the_tooling_package_says_so_and_exits_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(cli_main, "tool_modules", dict)

    assert cli_main.main(["demo", "--mode", "write"]) == 2
    err = capsys.readouterr().err
    assert "moriio demo: error: demo is not part of this installation" in err
    assert "moriio-tools" in err


def test_a_tool_command_whose_module_is_missing_names_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(cli_main, "tool_modules", lambda: {"bench": "moriio_tools._absent"})

    assert cli_main.main(["bench"]) == 2
    assert "moriio_tools._absent is missing" in capsys.readouterr().err


def test_a_tool_command_runs_its_module_with_its_own_arguments(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen = []
    fake = ModuleType("moriio_tools._fake_demo")

    def add_arguments(parser: object) -> None:
        parser.add_argument("--custom", type=int, default=0)  # type: ignore[attr-defined]

    def run(args: object) -> int:
        seen.append(args)
        return 3

    fake.add_arguments = add_arguments  # type: ignore[attr-defined]
    fake.run = run  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "moriio_tools._fake_demo", fake)
    monkeypatch.setattr(cli_main, "tool_modules", lambda: {"demo": "moriio_tools._fake_demo"})

    assert cli_main.main(["demo", "--custom", "7"]) == 3
    assert seen[0].custom == 7


def test_the_installed_tooling_provides_demo_and_bench() -> None:
    assert set(cli_main.tool_modules()) >= set(cli_main.TOOL_COMMANDS)
    demo = cli_main.load_tool("demo")
    args = cli_main.build_parser({"demo": demo}).parse_args(
        ["demo", "--mode", "write", "--requests", "5", "--max-tokens", "8"]
    )
    assert (args.requests, args.max_tokens) == (5, 8)
    assert "write" in str(args.mode)


def test_console_script_module_runs_a_subcommand() -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "moriio.cli.main",
            "plan",
            "--shape",
            "4,16,64",
            "--block-size",
            "16",
            "--kind",
            "mla",
            "--local",
            "0-3",
            "--json",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["plan"]["descriptors"] == 1


@pytest.mark.parametrize("value", ["0", "-3", "inf", "nan", "soon"])
def test_router_refuses_a_stale_after_that_is_no_duration(
    value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli_main.build_parser().parse_args(["router", "--stale-after", value])
    assert exit_info.value.code == 2
    assert "--stale-after: must be a positive number of seconds" in capsys.readouterr().err


def test_router_takes_a_stale_after_in_seconds() -> None:
    args = cli_main.build_parser().parse_args(["router", "--stale-after", "2.5"])
    assert args.stale_after == 2.5
