"""No module of replayproxy/proxy imports one that imports it back, directly or around a loop
(TYPE_CHECKING imports included: a cycle there is the same tangle, only hidden at run time)."""

from __future__ import annotations

import ast
from pathlib import Path

PROXY = Path(__file__).resolve().parents[2] / "replayproxy" / "proxy"


def imports_of(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module == "replayproxy.proxy":
                found.update(alias.name for alias in node.names)
            elif node.module.startswith("replayproxy.proxy."):
                found.add(node.module.split(".")[2])
        elif isinstance(node, ast.Import):
            found.update(a.name.split(".")[2] for a in node.names if a.name.startswith("replayproxy.proxy."))
    return found & {p.stem for p in PROXY.glob("*.py")}


def test_proxy_modules_import_one_way() -> None:
    graph = {path.stem: imports_of(path) - {path.stem} for path in PROXY.glob("*.py")}
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
