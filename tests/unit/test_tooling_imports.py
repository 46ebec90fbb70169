"""moriio's tests reach the tooling only through its public modules.

Those are :mod:`moriio_tools.harness` and :mod:`moriio_tools.vllm_harness`; the tooling's own
tests (``tooling/tests``) may import anything in it. An import statement,
``importlib.import_module`` and a dotted ``monkeypatch.setattr``/``delattr`` target all count.
"""

from __future__ import annotations

import ast
from pathlib import Path

TOOLING = "moriio_tools"
PUBLIC = frozenset({"moriio_tools.harness", "moriio_tools.vllm_harness"})
ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"
IMPORTING_CALLS = frozenset({"import_module", "__import__"})
DOTTED_TARGET_CALLS = frozenset({"setattr", "delattr"})  # "pkg.module.attr": imports pkg.module


def _callee(func: ast.expr) -> str:
    if isinstance(func, ast.Attribute):
        return func.attr
    return func.id if isinstance(func, ast.Name) else ""


def _modules(node: ast.AST) -> list[str]:
    """The modules ``node`` imports by name (none when it imports nothing)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
        if node.module == TOOLING:  # `from moriio_tools import harness` imports a submodule
            return [f"{TOOLING}.{alias.name}" for alias in node.names]
        return [node.module]
    if not isinstance(node, ast.Call) or not node.args:
        return []
    first = node.args[0]
    if not (isinstance(first, ast.Constant) and isinstance(first.value, str)):
        return []
    name = _callee(node.func)
    if name in IMPORTING_CALLS:
        return [first.value]
    if name in DOTTED_TARGET_CALLS and "." in first.value:
        return [first.value.rpartition(".")[0]]
    return []


def private_uses(source: str) -> list[tuple[int, str]]:
    """``(line, module)`` for each tooling module ``source`` imports other than the public ones."""
    found = [
        (getattr(node, "lineno", 0), module)
        for node in ast.walk(ast.parse(source))
        for module in _modules(node)
        if (module == TOOLING or module.startswith(f"{TOOLING}.")) and module not in PUBLIC
    ]
    return sorted(found)


def test_the_check_names_each_private_import_and_passes_the_public_ones() -> None:
    source = "\n".join(
        [
            "import moriio_tools.serve.processes",  # 1
            "from moriio_tools.stepped.pair import STEPPED_CONNECTORS",  # 2
            "from moriio_tools import harness, prompts",  # 3
            "from moriio_tools.harness import free_ports",  # 4
            "import moriio_tools.vllm_harness",  # 5
            "def f(monkeypatch, importlib):",  # 6
            "    monkeypatch.setattr('moriio_tools.sim.checks.LIMIT', 0)",  # 7
            "    monkeypatch.setattr('moriio_tools.harness.free_ports', None)",  # 8
            "    importlib.import_module('moriio_tools.cli.demo')",  # 9
            "    monkeypatch.setattr(object(), 'moriio_tools', 0)",  # 10
            "    return 'python -m moriio_tools.sim'",  # 11
            "from moriio.cli import main",  # 12
            "import moriio_tools",  # 13
        ]
    )
    assert private_uses(source) == [
        (1, "moriio_tools.serve.processes"),
        (2, "moriio_tools.stepped.pair"),
        (3, "moriio_tools.prompts"),
        (7, "moriio_tools.sim.checks"),
        (9, "moriio_tools.cli.demo"),
        (13, "moriio_tools"),
    ]


def test_tests_import_the_tooling_only_through_its_public_modules() -> None:
    offenders: list[str] = []
    public_users = 0
    for path in sorted(TESTS.rglob("*.py")):
        source = path.read_text(encoding="utf-8")
        public_users += any(f"from {module} import" in source for module in PUBLIC)
        offenders += [
            f"{path.relative_to(ROOT)}:{line}: imports {module}"
            for line, module in private_uses(source)
        ]
    assert public_users > 10  # the tests were found, and they do use the tooling
    assert offenders == [], "import it from moriio_tools.harness or moriio_tools.vllm_harness"
