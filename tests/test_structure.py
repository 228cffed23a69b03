"""The package's shape, checked statically (CPU, no package import, well under a second).

* The import graph of ``sglang_rq`` and ``rq_kernels`` (module-level and function-level imports,
  ``if TYPE_CHECKING:`` blocks excluded), built with `ast`: no circle among ``sglang_rq``
  modules; the entry points are imported only by entry points (``sglang-rq`` dispatches to
  ``serve`` and ``doctor``); ``rq_kernels`` imports nothing from ``sglang_rq`` (its argument
  types live in ``rq_kernels.view``; the serving package picks kernel or twin).
* docs/structure.md has one paragraph per module, and its environment table is
  `sglang_rq.env.markdown_table` (every ``SGLANG_RQ_*`` name used anywhere is registered).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("sglang_rq", "rq_kernels")
ENTRY_POINTS = frozenset({"sglang_rq.cli", "sglang_rq.launch_server", "sglang_rq.doctor"})
STRUCTURE_DOC = ROOT / "docs" / "structure.md"
ENV_TABLE = re.compile(r"<!-- env-table:start -->\n(.*?)<!-- env-table:end -->", re.S)


def modules() -> dict[str, Path]:
    """Dotted name -> file of every module of the two packages."""
    out = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = path
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imported_names(name: str, path: Path) -> set[str]:
    """Dotted names imported anywhere in the file, except under ``if TYPE_CHECKING:``."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against this module's package
                base = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
                base = base[:len(base) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text(), filename=str(path)))
    return found


def import_graph() -> dict[str, set[str]]:
    """Module -> the package modules it imports (each import resolved to the most specific
    existing module: ``from sglang_rq import env`` is an edge to ``sglang_rq.env``)."""
    mods = modules()
    graph = {}
    for name, path in mods.items():
        edges = set()
        for target in _imported_names(name, path):
            while target and target not in mods:
                target = target.rpartition(".")[0]
            if target and target != name:
                edges.add(target)
        graph[name] = edges
    return graph


def find_cycle(graph: dict[str, set[str]], nodes: set[str]) -> list[str] | None:
    """One circle among ``nodes`` (as a path that returns to its start), or None."""
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done
    stack: list[str] = []

    def dfs(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node] & nodes):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (cycle := dfs(nxt)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(nodes):
        if node not in state and (cycle := dfs(node)):
            return cycle
    return None


def test_graph_builder_sees_function_level_imports_and_skips_type_checking(tmp_path):
    src = tmp_path / "m.py"
    src.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import a.typing_only\n"
                   "else:\n    import a.runtime\ndef f():\n    from b import c\n")
    assert _imported_names("pkg.m", src) == {"typing", "typing.TYPE_CHECKING", "a.runtime",
                                             "b", "b.c"}
    assert find_cycle({"x": {"y"}, "y": {"z"}, "z": {"x"}}, {"x", "y", "z"}) == ["x", "y", "z", "x"]
    assert find_cycle({"x": {"y"}, "y": set()}, {"x", "y"}) is None


def test_no_import_circle_in_the_serving_package():
    graph = import_graph()
    serving = {m for m in graph if m.split(".")[0] == "sglang_rq"}
    assert find_cycle(graph, serving) is None, f"import circle: {' -> '.join(find_cycle(graph, serving))}"


def test_entry_points_are_imported_by_no_library_module():
    graph = import_graph()
    assert ENTRY_POINTS <= set(graph)
    offenders = sorted(f"{m} -> {t}" for m, edges in graph.items() if m not in ENTRY_POINTS
                       for t in edges & ENTRY_POINTS)
    assert not offenders, f"library modules import entry points: {offenders}"


def test_kernel_package_imports_nothing_from_the_serving_package():
    graph = import_graph()
    offenders = sorted(f"{m} -> {t}" for m, edges in graph.items()
                       if m.split(".")[0] == "rq_kernels" for t in edges
                       if t.split(".")[0] == "sglang_rq")
    assert not offenders, f"rq_kernels imports sglang_rq: {offenders}"


def _documented_paths() -> set[str]:
    return set(re.findall(r"^- `([^`]+\.py)`", STRUCTURE_DOC.read_text(), flags=re.M))


def test_every_module_has_a_paragraph_in_structure_doc():
    documented = _documented_paths()
    missing = []
    for path in modules().values():
        rel = path.relative_to(ROOT).as_posix()
        tree = ast.parse(path.read_text())
        if path.name == "__init__.py" and all(
                isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant) for n in tree.body):
            continue  # a package marker with at most a docstring
        if rel not in documented:
            missing.append(rel)
    assert not missing, f"docs/structure.md has no paragraph (a line '- `PATH`') for {missing}"
    stale = sorted(p for p in documented if not (ROOT / p).exists())
    assert not stale, f"docs/structure.md describes modules that do not exist: {stale}"


def test_structure_doc_env_table_is_generated_from_env_registry():
    from sglang_rq import env

    match = ENV_TABLE.search(STRUCTURE_DOC.read_text())
    assert match, "docs/structure.md lacks the <!-- env-table:start/end --> block"
    assert match.group(1) == env.markdown_table(), (
        "docs/structure.md's environment table is stale; paste "
        "`python -c 'from sglang_rq import env; print(env.markdown_table(), end=\"\")'`")


def test_every_sglang_rq_variable_in_the_repository_is_registered():
    from sglang_rq import env

    known = {v.name for v in env.registry()} | {t.name for t in env.TOOLING}
    used: dict[str, str] = {}
    for folder in ("sglang_rq", "rq_kernels", "tests", "benchmarks", "scripts", "docker",
                   "deploy", "k8s", "loadtest", "training", ".ci"):
        for path in (ROOT / folder).rglob("*"):
            if path.is_file() and path.suffix in ("", ".py", ".sh", ".yml", ".yaml", ".toml"):
                for name in re.findall(r"SGLANG_RQ_[A-Z0-9_]+", path.read_text(errors="replace")):
                    used.setdefault(name, path.relative_to(ROOT).as_posix())
    unknown = {n: p for n, p in used.items() if n not in known}
    assert not unknown, f"unregistered variables (add them to sglang_rq/env.py): {unknown}"
