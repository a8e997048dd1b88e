"""No function in gpudiag/ is longer than 80 lines, no module longer than 700 (issue 19).

A function a reader takes in at once; a module of one purpose.

Run as a script to list the longest: ``python tests/unit/lint/test_function_size.py [N]``.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

from testpaths import PACKAGE

LIMIT = 80
MODULE_LIMIT = 700


def long_functions(root: Path = PACKAGE, limit: int = LIMIT) -> list[tuple[int, str, str]]:
    """(lines, file relative to the package's parent, qualified name) of each longer function."""
    out = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        stack: list[tuple[ast.AST, str]] = [(tree, "")]
        while stack:
            node, prefix = stack.pop()
            for child in ast.iter_child_nodes(node):
                name = prefix
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    name = f"{prefix}{child.name}"
                    if not isinstance(child, ast.ClassDef):
                        lines = (child.end_lineno or child.lineno) - child.lineno + 1
                        if lines > limit:
                            rel = path.relative_to(root.parent).as_posix()
                            out.append((lines, rel, name))
                    name += "."
                stack.append((child, name))
    return sorted(out, reverse=True)


def test_no_function_in_gpudiag_over_80_lines() -> None:
    found = long_functions()
    assert not found, found


def long_modules(root: Path = PACKAGE, limit: int = MODULE_LIMIT) -> list[tuple[int, str]]:
    """(lines, file relative to the package's parent) of each module longer than ``limit``."""
    out = []
    for path in sorted(root.rglob("*.py")):
        lines = len(path.read_text(encoding="utf-8").splitlines())
        if lines > limit:
            out.append((lines, path.relative_to(root.parent).as_posix()))
    return sorted(out, reverse=True)


def test_no_module_in_gpudiag_over_700_lines() -> None:
    found = long_modules()
    assert not found, found


def test_the_module_lister_counts_lines(tmp_path: Path) -> None:
    (tmp_path / "long.py").write_text("x = 1\n" * (MODULE_LIMIT + 1))
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "short.py").write_text("x = 1\n" * MODULE_LIMIT)
    assert long_modules(tmp_path) == [(MODULE_LIMIT + 1, f"{tmp_path.name}/long.py")]


def test_the_lister_finds_methods_and_nested_functions(tmp_path: Path) -> None:
    def body(indent: str) -> str:
        return "".join(f"{indent}x{i} = {i}\n" for i in range(LIMIT))

    source = (
        "class A:\n    def long(self):\n"
        + body(" " * 8)
        + "def outer():\n    def inner():\n"
        + body(" " * 8)
        + "def short():\n"
        + body(" " * 4)[: -len(f"    x{LIMIT - 1} = {LIMIT - 1}\n")]
    )
    (tmp_path / "m.py").write_text(source)
    names = [n for _, _, n in long_functions(tmp_path, LIMIT)]
    assert sorted(names) == ["A.long", "outer", "outer.inner"]


if __name__ == "__main__":
    for lines, rel, name in long_functions(limit=int(sys.argv[1]) if len(sys.argv) > 1 else LIMIT):
        print(f"{lines:4d}  {rel}  {name}")
    for lines, rel in long_modules():
        print(f"{lines:4d}  {rel}")
