"""The import table of DESIGN.md, enforced: feature packages meet only through trace and result files."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "replayproxy"
CORE = {"shape", "sse", "clock", "tasks", "config", "errors"}

# module (or package) -> project modules it may import; DESIGN.md "Allowed imports".
ALLOWED: dict[str, set[str]] = {
    "errors": set(),
    "shape": set(),
    "sse": set(),
    "clock": set(),
    "tasks": set(),
    "children": {"clock"},
    "gguf_model": {"errors"},
    "config": {"errors"},
    "trace": {"shape", "errors"},
    "results": {"shape", "trace", "errors"},
    "formats": {"shape", "trace", "errors"},
    "proxy": {"shape", "sse", "trace", "clock", "tasks", "config", "errors", "gguf_model"},
    "replay": {"shape", "sse", "trace", "results", "clock", "tasks", "config", "errors", "gguf_model"},
    "report": {"shape", "trace", "results", "config", "errors"},
    "check": {"shape", "sse", "results", "trace", "clock", "tasks", "children", "config", "errors"},
    "capacity": {"trace", "results", "errors"},
    "sim": set(),
    "synthetic": {"shape", "trace", "errors"},
    "workload_stats": {"shape", "trace", "errors"},
}
# CLI glue has cli.py's rights (everything but sim): cli itself, the demo, its launcher, and each subcommand's
# `command.py` / `*_command.py` handler, which cli.py delegates to.
GLUE_MODULES = {"cli", "demo", "launch", "__main__", "__init__"}
GLUE_PACKAGES = {
    "tune",
    "sweep",
}  # glue joining features (starts engines, drives replays, hands results to report)


def _is_glue(path: Path) -> bool:
    return (
        path.stem in GLUE_MODULES
        and path.parent == PACKAGE
        or path.stem == "command"
        or path.stem.endswith("_command")
        or path.relative_to(PACKAGE).parts[0] in GLUE_PACKAGES
    )


def _owner(path: Path) -> str:
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    return parts[0]


def _project_imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        else:
            continue
        for name in names:
            parts = name.split(".")
            if parts[0] == "replayproxy" and len(parts) > 1:
                found.add(parts[1])
    return found


SOURCES = sorted(PACKAGE.rglob("*.py"))


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_imports_follow_the_design_table(path: Path) -> None:
    owner = _owner(path)
    imports = _project_imports(path) - {owner}
    if _is_glue(path):
        assert "sim" not in imports, f"{path.name} imports the simulated engine"
        return
    assert owner in ALLOWED, f"{owner} is not in the DESIGN.md import table; add it there and here"
    forbidden = imports - ALLOWED[owner]
    assert not forbidden, (
        f"{path.relative_to(PACKAGE)} may not import {sorted(forbidden)} (DESIGN.md import table; "
        "only CLI glue modules — cli.py, demo.py, command.py, *_command.py — may combine feature packages)"
    )


def _is_command(path: Path) -> bool:
    return path.stem == "command" or path.stem.endswith("_command")


def _is_module(name: str) -> bool:
    path = PACKAGE.parent.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or path.is_dir()


def _imported_modules(path: Path) -> set[str]:
    """The project modules `path` imports, `from a import b` counted as `a.b` where b is a module."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return {name for name in found if name.startswith("replayproxy.") and _is_module(name)}


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_library_imports_a_command_module(path: Path) -> None:
    """A command module is the CLI's (cli.py loads it lazily by name): what any other module needs,
    another command included (`compare` parses replay's options and writes report's report), lives
    in a library module."""
    if path == PACKAGE / "cli.py":
        return
    commands = sorted(
        name for name in _imported_modules(path) if _is_command(Path(name.rsplit(".", 1)[-1]))
    )  # fmt: skip
    assert not commands, f"{path.relative_to(PACKAGE)} imports {commands}: move what it needs out of them"


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_only_clock_reads_clocks_and_tasks_are_spawned(path: Path) -> None:
    if path.name == "clock.py" or _owner(path) == "sim":
        return
    text = path.read_text()
    for banned in (
        "time.time(",
        "time.monotonic(",
        "time.perf_counter(",
        "time.perf_counter_ns(",
        "time.time_ns(",
    ):
        assert banned not in text, (
            f"{path.relative_to(PACKAGE)} reads a clock directly ({banned}); use replayproxy.clock"
        )
    if path.name != "tasks.py":
        assert "asyncio.create_task(" not in text, f"{path.relative_to(PACKAGE)}: use replayproxy.tasks.spawn"


def test_the_table_sees_every_package() -> None:
    owners = {_owner(p) for p in SOURCES if not _is_glue(p)}
    assert owners <= set(ALLOWED), owners - set(ALLOWED)


ROOT = PACKAGE.parent
PROSE = [*SOURCES, *sorted((ROOT / "docs").rglob("*.md")), *sorted((ROOT / "benchmarks").rglob("*.py"))]
PROSE += [ROOT / "README.md", ROOT / "BENCHMARKS.md"]


def test_no_issue_numbers_in_code_or_docs() -> None:
    """A newcomer cannot look up "issue 4": code and docs state the rule itself instead."""
    cited = re.compile(r"\bissues? #?\d+|\(#\d+\)", re.IGNORECASE)
    found = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in PROSE
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if cited.search(line)
    ]
    assert not found, "\n".join(found)
