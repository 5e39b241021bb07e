"""No module of replayproxy/proxy imports one that imports it back, directly or around a loop
(TYPE_CHECKING imports included: a cycle there is the same tangle, only hidden at run time)."""

from __future__ import annotations

import ast
from pathlib import Path

PROXY = Path(__file__).resolve().parents[2] / "replayproxy" / "proxy"


def module_name(path: Path) -> str:
    """`exchange`, `recording.child`; a sub-package's __init__ is the package's name."""
    parts = path.relative_to(PROXY).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(path) for path in PROXY.rglob("*.py")} - {""}


def imports_of(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("replayproxy.proxy"):
            base = node.module.removeprefix("replayproxy.proxy").removeprefix(".")
            for alias in node.names:
                inner = f"{base}.{alias.name}" if base else alias.name
                found.add(inner if inner in MODULES else base)
        elif isinstance(node, ast.Import):
            found.update(
                a.name.removeprefix("replayproxy.proxy.")
                for a in node.names
                if a.name.startswith("replayproxy.proxy.")
            )
    return found & MODULES


def test_proxy_modules_import_one_way() -> None:
    graph = {module_name(path): imports_of(path) - {module_name(path)} for path in PROXY.rglob("*.py")}
    graph.pop("", None)
    state: dict[str, str] = {}

    def visit(module: str, trail: list[str]) -> None:
        state[module] = "open"
        for target in sorted(graph[module]):
            assert state.get(target) != "open", f"import cycle: {' -> '.join([*trail, module, target])}"
            if target not in state:
                visit(target, [*trail, module])
        state[module] = "done"

    for module in sorted(graph):
        if module not in state:
            visit(module, [])
    assert graph["exchange"] and "forward" not in graph["exchange"]
