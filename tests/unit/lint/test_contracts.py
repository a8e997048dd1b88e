"""Typed contracts (issue 28): no module-level import cycle in gpudiag/, no string-keyed metric
or evidence lookups, and a ceiling on the ``dict[str, Any]`` annotations left in analysis/.

The import graph is read with ``ast`` from each module's top-level imports (those under
``if TYPE_CHECKING:`` and inside functions do not run at import time), so a cycle is found
without importing anything.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

PKG = Path(__file__).resolve().parents[3] / "gpudiag"
# The ``dict[str, Any]`` annotations of gpudiag/analysis/ (parameters, returns, fields and
# variables) as of issue 28 (104; 113 with the hangs, efficiency and reading work merged since;
# 57 once a rank's evidence parts and the findings' sub-objects were typed (model/evidence.py,
# model/metrics.py), then findings/, compare/, remedies/, run/ and hangs/); lower it when you
# type one, never raise it.
DICT_ANY_MAX = 2


def _modules() -> dict[str, Path]:
    out = {}
    for p in PKG.rglob("*.py"):
        parts = list(p.relative_to(PKG.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = p
    assert len(out) > 100, "gpudiag's modules were not found"
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _top_level_imports(
    tree: ast.Module, modules: set[str] | frozenset[str] = frozenset()
) -> set[str]:
    """Every module a module's body imports when it runs.

    ``from a import b``: ``a.b`` when it is one of ``modules``, else ``a`` (a name it defines).
    """
    names: set[str] = set()
    todo: list[ast.stmt] = list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, ast.If):
            todo += node.orelse if _is_type_checking(node.test) else node.body + node.orelse
        elif isinstance(node, ast.Try):
            todo += node.body + node.orelse + node.finalbody
            todo += [s for h in node.handlers for s in h.body]
        elif isinstance(node, (ast.With, ast.AsyncWith)):
            todo += node.body
        elif isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            subs = {f"{node.module}.{a.name}" for a in node.names}
            names |= (subs & modules) | ({node.module} if subs - modules else set())
    return names


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    graph = {}
    for name, path in mods.items():
        deps = _top_level_imports(ast.parse(path.read_text(encoding="utf-8")), set(mods))
        graph[name] = {d for d in deps if d in mods and d != name}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    tree = ast.parse("import x\nif TYPE_CHECKING:\n    import y\ndef f():\n    import z\n")
    assert _top_level_imports(tree) == {"x"}


def test_no_module_level_import_cycle_in_gpudiag() -> None:
    assert _cycles(_graph()) == []


def _sources(folder: Path) -> list[tuple[Path, str]]:
    files = sorted(folder.rglob("*.py"))
    assert files, f"no modules under {folder}"
    return [(p, p.read_text(encoding="utf-8")) for p in files]


def test_no_string_keyed_metric_or_evidence_lookups() -> None:
    # a finding's metrics and a rank's evidence are typed records: read their fields
    lookup = re.compile(r"\b(mx|ev)\(\s*\w[\w.\[\]]*\s*,\s*[\"']")
    found = [
        f"{p.relative_to(PKG.parent)}: {m.group(0)}"
        for p, text in _sources(PKG)
        for m in lookup.finditer(text)
    ]
    assert found == []


def _dict_any(tree: ast.Module) -> int:
    annotations: list[ast.expr] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.AnnAssign):
            annotations.append(node.annotation)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            a = node.args
            annotations += [
                x.annotation
                for x in [*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg]
                if x is not None and x.annotation is not None
            ]
            annotations += [node.returns] if node.returns is not None else []
    return sum(ast.unparse(x).count("dict[str, Any]") for x in annotations)


def test_dict_str_any_in_analysis_stays_under_its_ceiling() -> None:
    n = sum(_dict_any(ast.parse(text)) for _, text in _sources(PKG / "analysis"))
    assert n <= DICT_ANY_MAX, (
        f"{n} dict[str, Any] annotations in analysis/ (at most {DICT_ANY_MAX})"
    )
