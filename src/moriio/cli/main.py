"""The ``moriio`` command: ``demo``, ``bench``, ``doctor``, ``plan`` and ``router``.

Importing this module is cheap: each subcommand imports what it needs (vLLM, torch, NIXL,
ZMQ, matplotlib) only when it runs.
"""

from __future__ import annotations

import argparse
import copy
import importlib
import sys
from collections.abc import Sequence
from types import ModuleType

DEMO_MODULE = "moriio.cli.demo"


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("moriio")
    except PackageNotFoundError:
        return "unknown"


class DemoUnavailableError(RuntimeError):
    """``moriio.cli.demo`` cannot be imported."""


def load_demo() -> ModuleType:
    """The demo module; DemoUnavailableError says why it cannot be loaded."""
    try:
        return importlib.import_module(DEMO_MODULE)
    except ModuleNotFoundError as exc:
        if exc.name == DEMO_MODULE:
            raise DemoUnavailableError(
                f"the demo is not part of this installation ({DEMO_MODULE} is missing)"
            ) from exc
        raise DemoUnavailableError(f"cannot import {DEMO_MODULE}: {exc}") from exc
    except ImportError as exc:
        raise DemoUnavailableError(f"cannot import {DEMO_MODULE}: {exc}") from exc


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


def _add_default_demo_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--mode", choices=("read", "write"), default="read")
    parser.add_argument("--requests", type=int, default=32, help="prompts to run")
    parser.add_argument("--prompt-len", type=int, default=128, help="tokens per prompt")
    parser.add_argument("--concurrency", type=int, default=4, help="requests in flight")
    parser.add_argument("--json", action="store_true", help="print one JSON summary object")


def build_parser(demo: ModuleType | None = None) -> argparse.ArgumentParser:
    """The argument parser; ``demo`` (when loaded) may contribute ``add_arguments``."""
    from moriio.cli import bench, doctor, plan, router

    parser = argparse.ArgumentParser(
        prog="moriio", description="KV-cache transfer for disaggregated LLM serving."
    )
    parser.add_argument("--version", action="version", version=f"moriio {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    p = sub.add_parser(
        "demo",
        help="1P1D disaggregated run on this machine",
        description=description(getattr(demo, "__doc__", None)) or "Run the demo.",
        formatter_class=HelpFormatter,
    )
    add_demo = getattr(demo, "add_arguments", None)
    if callable(add_demo):
        add_demo(p)
    else:
        _add_default_demo_arguments(p)

    p = sub.add_parser(
        "bench",
        help="planner, transport and scheduler benchmarks",
        description=description(bench.__doc__),
        formatter_class=HelpFormatter,
    )
    bench.add_arguments(p)

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


def _run_demo(args: argparse.Namespace, demo: ModuleType | None, error: str | None) -> int:
    if demo is None:
        print(f"moriio demo: error: {error}", file=sys.stderr)
        return 2
    result = demo.run(args)
    return int(result) if result is not None else 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``moriio`` console script; returns the exit status."""
    arguments = list(sys.argv[1:] if argv is None else argv)
    demo: ModuleType | None = None
    demo_error: str | None = None
    if arguments[:1] == ["demo"]:
        try:
            demo = load_demo()
        except DemoUnavailableError as exc:
            demo_error = str(exc)
    args = build_parser(demo).parse_args(arguments)
    if args.command == "demo":
        return _run_demo(args, demo, demo_error)
    module = importlib.import_module(f"moriio.cli.{args.command}")
    return int(module.run(args))


if __name__ == "__main__":
    sys.exit(main())
