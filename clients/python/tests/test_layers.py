"""The package's modules import downward only: each module, at run time,
imports only modules listed before it below (imports for type checking
aside), and never inside a function. An import circle, or a lazy import
that hides one, fails here."""

from __future__ import annotations

import ast
import pathlib

SRC = pathlib.Path(__file__).resolve().parent.parent / "src" / "baton"

#: Bottom first: the shared pieces, the asyncio client, then the sync
#: client that runs its sessions on it, then the package's front door.
ORDER = [
    "baton._proto",
    "baton.errors",
    "baton.rules",
    "baton._dial",
    "baton._types",
    "baton._wire",
    "baton._kept",
    "baton._ledger",
    "baton.fence",
    "baton.aio._grpc",
    "baton.aio.watch",
    "baton.aio.session",
    "baton.aio.keeper",
    "baton.aio.election",
    "baton.aio.client",
    "baton.aio",
    "baton.session",
    "baton.keeper",
    "baton.watch",
    "baton.client",
    "baton",
]


def module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def rank(name: str) -> int:
    """The place of ``name`` (or of the package it is in) in ORDER."""
    while name not in ORDER:
        assert "." in name, f"{name} is not in ORDER: place it"
        name = name.rsplit(".", 1)[0]
    return ORDER.index(name)


def is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def runtime_imports(tree: ast.Module) -> list[tuple[str, int, bool]]:
    """(module imported, line, whether at the module's top level) for each
    import of ``baton`` outside ``if TYPE_CHECKING:`` blocks."""
    found: list[tuple[str, int, bool]] = []

    def visit(node: ast.AST, top: bool) -> None:
        if isinstance(node, ast.If) and is_type_checking(node):
            for branch in node.orelse:
                visit(branch, top)
            return
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.split(".")[0] == "baton":
                for alias in node.names:
                    sub = f"{node.module}.{alias.name}"
                    found.append((sub if sub in ORDER else node.module, node.lineno, top))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "baton":
                    found.append((alias.name, node.lineno, top))
        inner = top and not isinstance(
            node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)
        )
        for child in ast.iter_child_nodes(node):
            visit(child, inner)

    for stmt in tree.body:
        visit(stmt, True)
    return found


def test_every_module_imports_only_modules_below_it_and_at_its_top() -> None:
    modules = sorted(p for p in SRC.rglob("*.py") if "_proto" not in p.parts)
    assert len(modules) >= 18, modules
    problems = []
    for path in modules:
        name = module_name(path)
        for imported, line, top in runtime_imports(ast.parse(path.read_text())):
            where = f"{path.relative_to(SRC.parent)}:{line}"
            if not top:
                problems.append(f"{where}: imports {imported} inside a function or class")
            elif rank(imported) >= rank(name):
                problems.append(f"{where}: {name} imports {imported}, which is not below it")
    assert not problems, "\n".join(problems)


def test_the_check_sees_an_upward_and_a_lazy_import() -> None:
    """The negative control: the rule above would catch both."""
    tree = ast.parse(
        "from baton.client import Client\n"
        "def f():\n"
        "    from baton import aio\n"
        "if TYPE_CHECKING:\n"
        "    from baton.watch import Watch\n"
    )
    found = runtime_imports(tree)
    assert found == [("baton.client", 1, True), ("baton.aio", 3, False)]
    assert rank("baton.client") > rank("baton.session")
