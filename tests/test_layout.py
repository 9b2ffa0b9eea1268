"""The house's layout rules (docs/architecture.md), read from the source: no import circle among the modules
(deferred imports included), MLflow imported only by the store and the few readers allowed it, and no module or function
past its size."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("edps_mlflow", "analysis")
# Where `import mlflow` may stand: the store, MLflow Projects, and the analysis' reader and publisher.
MLFLOW_ALLOWED = ("edps_mlflow/store/", "edps_mlflow/mlproject.py", "analysis/load.py", "analysis/publish.py")


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            parts = path.relative_to(REPO).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _imports(path: Path, name: str, modules: dict[str, Path]) -> set[str]:
    """The modules of ours that ``path`` imports, at its top or inside a function (an import deferred into a function
    still ties the two modules), but not under ``if TYPE_CHECKING``, which is for annotations only."""
    tree = ast.parse(path.read_text())
    annotations_only = {id(inner) for node in ast.walk(tree) if isinstance(node, ast.If)
                        and getattr(node.test, "id", getattr(node.test, "attr", None)) == "TYPE_CHECKING"
                        for inner in ast.walk(node)}
    imported = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(tree):
        if id(node) in annotations_only:
            continue
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1] + ([base] if base else []))
            targets = [f"{base}.{alias.name}" for alias in node.names] + [base]
        else:
            continue
        for target in targets:
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != name:
                imported.add(target)
    return imported


def test_no_import_circle():
    modules = _modules()
    graph = {name: _imports(path, name, modules) for name, path in modules.items()}
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(name: str) -> None:
        state[name] = 1
        stack.append(name)
        for target in sorted(graph[name]):
            if state.get(target) == 1:
                raise AssertionError("import circle: " + " -> ".join(stack[stack.index(target):] + [target]))
            if target not in state:
                visit(target)
        stack.pop()
        state[name] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name)


def test_mlflow_is_imported_only_where_allowed():
    offenders = []
    for path in _modules().values():
        relative = path.relative_to(REPO).as_posix()
        if relative.startswith(MLFLOW_ALLOWED):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            if any(n == "mlflow" or n.startswith("mlflow.") for n in names):
                offenders.append(f"{relative}:{node.lineno}")
    assert not offenders, f"mlflow imported outside the store and the analysis' reader: {offenders}"


def test_modules_and_functions_stay_small():
    too_long = []
    for path in _modules().values():
        relative = path.relative_to(REPO).as_posix()
        text = path.read_text()
        limit = 400 if relative.startswith("edps_mlflow/store/") else 500
        if text.count("\n") > limit:
            too_long.append(f"{relative}: {text.count(chr(10))} lines (at most {limit})")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno >= 60:
                too_long.append(f"{relative}:{node.lineno} {node.name}: {node.end_lineno - node.lineno + 1} lines")
    assert not too_long, "\n".join(too_long)
