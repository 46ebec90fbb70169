"""The ``moriio`` command: ``doctor``, ``plan`` and ``router``; ``demo`` and ``bench`` where
the tooling package is installed.

Importing this module is cheap: each subcommand imports what it needs (vLLM, torch, NIXL,
ZMQ, matplotlib) only when it runs. Commands outside the library (``demo``, ``bench``) are
found through the ``moriio.commands`` entry points; the library never imports them.
"""

from __future__ import annotations

import argparse
import copy
import importlib
import sys
from collections.abc import Mapping, Sequence
from importlib.metadata import entry_points
from types import ModuleType

TOOL_COMMANDS_GROUP = "moriio.commands"
# The tool commands the README documents, with their one-line help (shown even where the
# tooling package is not installed, so that running one says what is missing).
TOOL_COMMANDS = {
    "demo": "1P1D disaggregated run on this machine",
    "bench": "planner, transport and scheduler benchmarks",
}


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("moriio")
    except PackageNotFoundError:
        return "unknown"


class ToolUnavailableError(RuntimeError):
    """A tool command's module cannot be imported."""


def tool_modules() -> dict[str, str]:
    """Each installed tool command's module name, from the ``moriio.commands`` entry points."""
    return {ep.name: ep.value for ep in entry_points(group=TOOL_COMMANDS_GROUP)}


def load_tool(command: str) -> ModuleType:
    """The module behind tool ``command``; ToolUnavailableError says why it cannot be loaded."""
    name = tool_modules().get(command)
    if name is None:
        raise ToolUnavailableError(
            f"{command} is not part of this installation (the moriio-tools package in this "
            "repository's tooling/ provides it: scripts/setup.sh installs it)"
        )
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name == name:
            raise ToolUnavailableError(f"{command}: {name} is missing") from exc
        raise ToolUnavailableError(f"cannot import {name}: {exc}") from exc
    except ImportError as exc:
        raise ToolUnavailableError(f"cannot import {name}: {exc}") from exc


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Descriptions as written; each option's help ends with its default, unless the help
    already names one or there is none to show (None, False, an empty string)."""

    def _format_action(self, action: argparse.Action) -> str:
        if _default_to_show(action):
            action = copy.copy(action)
            action.help = f"{action.help or ''} (default: %(default)s)".lstrip()
        return super()._format_action(action)


def _default_to_show(action: argparse.Action) -> bool:
    default = action.default
    if not action.option_strings or action.help == argparse.SUPPRESS:
        return False
    if default is None or default is False or default in ("", argparse.SUPPRESS):
        return False
    return "default" not in (action.help or "")


def description(doc: str | None, *, whole: bool = False) -> str | None:
    """A module docstring as help text: its first paragraph (``whole``: all of it), without
    reStructuredText's literal markers."""
    if not doc:
        return None
    text = doc.strip() if whole else doc.strip().split("\n\n", 1)[0]
    return text.replace("``", "").replace("::\n", ":\n")


def build_parser(tools: Mapping[str, ModuleType] | None = None) -> argparse.ArgumentParser:
    """The argument parser; each tool module in ``tools`` contributes its ``add_arguments``
    and docstring (a tool not given is listed with its help line only, so that building the
    parser imports no tool)."""
    from moriio.cli import doctor, plan, router

    loaded = dict(tools or {})
    parser = argparse.ArgumentParser(
        prog="moriio", description="KV-cache transfer for disaggregated LLM serving."
    )
    parser.add_argument("--version", action="version", version=f"moriio {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    for command, help_line in TOOL_COMMANDS.items():
        module = loaded.get(command)
        p = sub.add_parser(
            command,
            help=help_line,
            description=description(getattr(module, "__doc__", None)) or help_line,
            formatter_class=HelpFormatter,
            add_help=module is not None,
        )
        if module is not None:
            module.add_arguments(p)
        else:  # whatever follows is refused by the tool's own error, not by argparse
            p.add_argument("rest", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)

    p = sub.add_parser(
        "doctor",
        help="preflight checks for a deployment",
        description=description(doctor.__doc__),
        formatter_class=HelpFormatter,
    )
    doctor.add_arguments(p)

    p = sub.add_parser(
        "plan",
        help="explain a layer's geometry and transfer plan",
        description=description(plan.__doc__, whole=True),
        formatter_class=HelpFormatter,
    )
    plan.add_arguments(p)

    p = sub.add_parser(
        "router",
        help="P/D router that engines register with (MoRIIO toy proxy protocol)",
        description=description(router.__doc__),
        formatter_class=HelpFormatter,
    )
    router.add_arguments(p)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``moriio`` console script; returns the exit status."""
    arguments = list(sys.argv[1:] if argv is None else argv)
    command = arguments[0] if arguments else None
    tools: dict[str, ModuleType] = {}
    if command in TOOL_COMMANDS:
        try:
            tools[command] = load_tool(command)
        except ToolUnavailableError as exc:
            print(f"moriio {command}: error: {exc}", file=sys.stderr)
            return 2
    args = build_parser(tools).parse_args(arguments)
    module = tools.get(args.command) or importlib.import_module(f"moriio.cli.{args.command}")
    result = module.run(args)
    return int(result) if result is not None else 0


if __name__ == "__main__":
    sys.exit(main())
