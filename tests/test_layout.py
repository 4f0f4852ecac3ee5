"""The house rules of docs/DESIGN.md ("Layout", "Floors", "Public API"), read from the source with ``ast``.

Imports point down the floors and never in a circle; small files, short functions; one public API
list; tests that mirror the package; benchmarks that import their helpers normally.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "comera_lightning"
DESIGN = ROOT / "docs" / "DESIGN_API.md"

#: Lowest first. A unit (a top-level module or subpackage of comera_lightning) imports only from lower floors
#: (and from itself); the units of one floor import nothing of each other. The same table is in docs/DESIGN.md.
FLOORS: list[set[str]] = [
    {"_checks", "_optional"},
    {"layers", "data"},
    {"optim"},
    {"rank"},
    {"tensorize"},
    {"schedule"},
    {"checkpoint", "export"},
    {"strategy"},
    {"callback"},
    {"distributed", "models"},
    {"cli"},
    {"__init__", "__main__"},
]
MAX_ROOT_MODULES = 8
MAX_FILE_LINES = 350
MAX_FUNCTION_LINES = 60
MAX_CALLBACK_LINES = 200
#: Test files that stay at the top of tests/: the root modules' tests and the checks of the whole project.
ROOT_TESTS = {"test_docs_site.py", "test_layout.py", "test_optional.py", "test_rank.py", "test_readme_commands.py", "test_wheel_install.py"}
#: Folders of tests/ that do not mirror a package folder.
TEST_SUPPORT = {"helpers", "scripts", "benchmarks"}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def unit_of(module: str) -> str:
    """``comera_lightning.tensorize.config`` -> ``tensorize``; the package's own ``__init__`` -> ``__init__``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def floor_of(unit: str) -> int:
    return next(i for i, units in enumerate(FLOORS) if unit in units)


def _resolve(module: str, package: str, level: int, name: str | None) -> str:
    if level:
        base = package.split(".")[: len(package.split(".")) - level + 1]
        module = ".".join([*base, module] if module else base)
    if name is not None and f"{module}.{name}" in MODULES:
        return f"{module}.{name}"
    return module


def imports_of(module: str) -> Iterator[str]:
    """Every comera_lightning module ``module`` imports, at any depth of its code (lazy imports included)."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    tree = ast.parse(path.read_text())
    constants = {t.id: n.value for n in tree.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            found = [_resolve(node.module or "", package, node.level, alias.name) for alias in node.names]
        elif isinstance(node, ast.Call) and getattr(node.func, "id", None) == "lazy_exports" and len(node.args) == 2:
            target = package if isinstance(node.args[0], ast.Name) else ast.literal_eval(node.args[0])
            names = constants[node.args[1].id] if isinstance(node.args[1], ast.Name) else node.args[1]
            found = [f"{target}.{ast.literal_eval(v)}" for v in names.values]
        else:
            continue
        for name in found:
            while name not in MODULES and "." in name:  # e.g. `import comera_lightning.data.criteo.npy` as a prefix
                name = name.rpartition(".")[0]
            if name in MODULES and name != module:
                yield name


GRAPH = {module: sorted(set(imports_of(module))) for module in MODULES}


def test_every_unit_has_a_floor():
    assert {unit_of(m) for m in MODULES} <= set().union(*FLOORS)


def test_imports_point_down_the_floors():
    upward = [
        f"{source} ({unit_of(source)}, floor {floor_of(unit_of(source))}) imports {target} ({unit_of(target)}, "
        f"floor {floor_of(unit_of(target))})"
        for source, targets in GRAPH.items()
        for target in targets
        if unit_of(source) != unit_of(target) and floor_of(unit_of(source)) <= floor_of(unit_of(target))
    ]
    assert not upward, "\n".join(upward)


def test_no_import_cycle():
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(node: str) -> None:  # Tarjan's strongly connected components
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in GRAPH[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for module in GRAPH:
        if module not in index:
            visit(module)
    assert not cycles, f"import cycles: {cycles}"


def test_package_root_holds_few_modules():
    root_modules = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(root_modules) <= MAX_ROOT_MODULES, root_modules


#: The benchmarks keep the same limits: a long benchmark is split into modules (its entry point stays).
SIZED_MODULES = {**MODULES, **{module_name(p): p for p in sorted((ROOT / "benchmarks").rglob("*.py"))}}


@pytest.mark.parametrize("module", sorted(SIZED_MODULES))
def test_files_and_functions_are_short(module):
    source = SIZED_MODULES[module].read_text()
    assert len(source.splitlines()) <= MAX_FILE_LINES, f"{module}: {len(source.splitlines())} lines"
    long = [
        f"{node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for node in ast.walk(ast.parse(source))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES
    ]
    assert not long, f"{module}: {long}"


def test_the_callback_class_stays_small():
    tree = ast.parse(MODULES["comera_lightning.callback"].read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "ComeraCallback")
    assert cls.end_lineno - cls.lineno + 1 < MAX_CALLBACK_LINES


def _design_imports(heading: str) -> dict[str, list[str]]:
    """The ``from X import (...)`` statements of the first python block under ``heading`` in docs/DESIGN_API.md."""
    text = DESIGN.read_text()
    section = text[text.index(heading):]
    block = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    return {node.module: [a.name for a in node.names] for node in ast.parse(block).body if isinstance(node, ast.ImportFrom)}


def test_all_is_the_public_api_of_the_design():
    import comera_lightning

    documented = _design_imports("## Public API")["comera_lightning"]
    assert sorted(comera_lightning.__all__) == sorted(documented)
    assert all(hasattr(comera_lightning, name) for name in comera_lightning.__all__)


def test_the_documented_subpackage_names_exist():
    import importlib

    for module, names in _design_imports("### Subpackage entry points").items():
        loaded = importlib.import_module(module)
        assert [n for n in names if not hasattr(loaded, n)] == [], module


def test_examples_import_only_documented_names():
    documented = {**_design_imports("## Public API"), **_design_imports("### Subpackage entry points")}
    wrong = []
    for path in sorted((ROOT / "examples").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("comera_lightning"):
                wrong += [f"{path.name}: {node.module}.{a.name}" for a in node.names if a.name not in documented.get(node.module, [])]
            elif isinstance(node, ast.Import):
                wrong += [f"{path.name}: import {a.name}" for a in node.names if a.name.startswith("comera_lightning.")]
    assert not wrong, wrong


def test_tests_mirror_the_package():
    tests = ROOT / "tests"
    at_root = sorted(p.name for p in tests.glob("test_*.py"))
    assert set(at_root) <= ROOT_TESTS, f"test files at the top of tests/ that belong in a folder: {sorted(set(at_root) - ROOT_TESTS)}"
    folders = {p.relative_to(tests) for p in tests.rglob("*") if p.is_dir() and not any(part.startswith((".", "__")) for part in p.relative_to(tests).parts)}
    mirrored = {f for f in folders if f.parts[0] not in TEST_SUPPORT}
    assert not [f for f in mirrored if not (PACKAGE / f).is_dir()], "tests/ folders with no package folder"
    packages = {p.parent.relative_to(PACKAGE) for p in PACKAGE.rglob("__init__.py") if p.parent != PACKAGE}
    untested = sorted(str(p) for p in packages if p not in mirrored)
    assert not untested, f"package folders with no tests/ folder: {untested}"


def _imports(path: Path) -> Iterator[str]:
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            yield node.module or ""
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "import_module" and node.args:
            if isinstance(node.args[0], ast.Constant):
                yield node.args[0].value


def test_only_the_benchmarks_own_tests_import_benchmarks():
    tests = ROOT / "tests"
    offenders = [
        str(p.relative_to(ROOT)) for p in tests.rglob("*.py")
        if p.relative_to(tests).parts[0] != "benchmarks" and any(m.split(".")[0] == "benchmarks" for m in _imports(p))
    ]
    assert not offenders, offenders


def test_benchmarks_import_their_helpers_normally():
    offenders = [str(p.relative_to(ROOT)) for p in (ROOT / "benchmarks").rglob("*.py") if "sys.path.insert" in p.read_text()]
    assert not offenders, offenders
