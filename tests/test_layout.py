"""The source tree keeps the shape the README's layout table describes: packages grouped by concept, each small enough
to take in at a glance and introduced by its `__init__` docstring, and no import cycle between modules (imports made
only for type checking included) nor between packages, so each package can be read from its parts up."""

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = sorted(init.parent for top in ("memvir", "demo") for init in (ROOT / top).rglob("__init__.py"))
MAX_MODULES = 12  # Python files in one folder, its __init__.py included


def _name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@pytest.mark.parametrize("package", PACKAGES, ids=_name)
def test_a_package_holds_at_most_twelve_modules(package):
    modules = sorted(path.name for path in package.glob("*.py"))
    assert len(modules) <= MAX_MODULES, f"{_name(package)} holds {len(modules)} modules: {modules}"


@pytest.mark.parametrize("package", PACKAGES, ids=_name)
def test_a_package_docstring_names_each_of_its_parts(package):
    docstring = ast.get_docstring(ast.parse((package / "__init__.py").read_text())) or ""
    parts = {path.stem for path in package.glob("*.py")} - {"__init__", "__main__"}
    parts |= {path.name for path in package.iterdir() if (path / "__init__.py").is_file()}
    named = set(re.findall(r"`([A-Za-z_]\w*)", docstring))
    assert parts <= named, f"{_name(package)}'s docstring does not name {sorted(parts - named)}"


def _imports(path: Path, modules: set[str]) -> set[str]:
    """The modules of `modules` that the file imports anywhere in it (functions and TYPE_CHECKING blocks included):
    ``from a.b import c`` imports a.b.c when c is a module, else a.b (its __init__)."""
    package = _name(path) if path.name == "__init__.py" else _name(path).rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names} & modules
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                found |= {f"{base}.{alias.name}"} & modules or {base} & modules
    return found


def test_no_module_imports_one_that_imports_it_back():
    files = {_name(path): path for top in ("memvir", "demo") for path in (ROOT / top).rglob("*.py")}
    graph = {module: _imports(path, set(files)) - {module} for module, path in files.items()}
    cycles, index, low, stack, on_stack = [], {}, {}, [], set()

    def visit(module):  # Tarjan's strongly connected components
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for imported in graph[module]:
            if imported not in index:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in on_stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            component = []
            while not component or component[-1] != module:
                component.append(stack.pop())
                on_stack.discard(component[-1])
            if len(component) > 1:
                cycles.append(sorted(component))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    assert not cycles, f"modules that import each other: {cycles}"


def _package(module: str) -> str:
    """The package a module belongs to for the package-level graph: memvir.data.glyphs.render is memvir.data's (a
    subpackage is part of its package); a module at the top (memvir.config, demo.page) stands for itself."""
    return ".".join(module.split(".")[:2])


def test_no_package_imports_one_that_imports_it_back():
    """Modules of two packages may import each other's without a module-level cycle (a run's bookkeeping taking the
    Train tab's words, the tab taking the runs): a cycle all the same, which this graph of packages finds. Each
    package imports only those below it."""
    files = {_name(path): path for top in ("memvir", "demo") for path in (ROOT / top).rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for module, path in files.items():
        graph.setdefault(_package(module), set()).update(
            _package(imported) for imported in _imports(path, set(files)) if _package(imported) != _package(module))

    def reaches(start: str, goal: str) -> bool:
        seen, todo = set(), [start]
        while todo:
            package = todo.pop()
            for imported in graph.get(package, ()):
                if imported == goal:
                    return True
                if imported not in seen:
                    seen.add(imported)
                    todo.append(imported)
        return False

    cycles = sorted({tuple(sorted((package, imported))) for package, imported_set in graph.items()
                     for imported in imported_set if reaches(imported, package)})
    assert not cycles, f"packages that import each other (directly or through others): {cycles}"


# Third-party internals the code relies on, each allowed in its dependency's one shim module only: gradio's queue,
# plotly's figure without validation, huggingface_hub's mixin config and safetensors loader.
PRIVATE_USES = {r"\._queue\b": "demo/common/shims.py", r"\b_validate=": "demo/common/shims.py",
                r"\b_hub_mixin_config\b": "memvir/_hub_shims.py",
                r"\b_load_as_safetensor\b": "memvir/_hub_shims.py"}


@pytest.mark.parametrize("private", sorted(PRIVATE_USES))
def test_a_private_third_party_name_appears_in_its_shim_module_only(private):
    sources = [*ROOT.glob("*.py"), *(path for top in ("memvir", "demo") for path in (ROOT / top).rglob("*.py"))]
    users = sorted(str(path.relative_to(ROOT)) for path in sources if re.search(private, path.read_text()))
    assert users == [PRIVATE_USES[private]]


# What a reader takes in at a glance (DEVELOPERS.md: split by concept, and each part small enough to read whole): a
# class of the app's, a function anywhere. Counted from the `def` or `class` line (decorators not) to the last line.
MAX_APP_CLASS_LINES = 300
MAX_FUNCTION_LINES = 80


def _longer_than(tops: tuple[str, ...], kinds: tuple[type, ...], most: int) -> list[str]:
    """`path:line name (N lines)` for each definition of `kinds` in the .py files under `tops` (folders of ROOT, or
    files) that spans more than `most` lines."""
    paths = [path for top in tops for path in ([ROOT / top] if top.endswith(".py") else (ROOT / top).rglob("*.py"))]
    found = []
    for path in sorted(paths):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, kinds) and node.end_lineno - node.lineno + 1 > most:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} "
                             f"({node.end_lineno - node.lineno + 1} lines)")
    return found


def test_no_class_of_the_app_is_over_300_lines():
    assert _longer_than(("demo",), (ast.ClassDef,), MAX_APP_CLASS_LINES) == []


def test_no_function_is_over_80_lines():
    kinds = (ast.FunctionDef, ast.AsyncFunctionDef)
    assert _longer_than(("memvir", "demo", "app.py"), kinds, MAX_FUNCTION_LINES) == []


def _unexplained_local_imports(path: Path) -> list[str]:
    """`path:line` of each import of the project's own modules made inside a function whose block of imports carries
    no comment (on one of its lines, or on the lines right above it) saying why it is not at the top."""
    lines = path.read_text().splitlines()
    found = []
    for function in ast.walk(ast.parse("\n".join(lines))):
        if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        statements = [node for node in ast.walk(function) if isinstance(node, ast.Import | ast.ImportFrom)]
        for node in statements:
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
            if getattr(node, "level", 0) or not any(name.split(".")[0] in ("memvir", "demo") for name in names):
                continue
            first, last = node.lineno, node.end_lineno  # widened to the imports around it: one block, one reason
            while any(other.end_lineno == first - 1 for other in statements):
                first -= 1
            while any(other.lineno == last + 1 for other in statements):
                last += 1
            above = first - 1
            while above >= 1 and lines[above - 1].strip().startswith("#"):
                above -= 1
            if above == first - 1 and not any("#" in line for line in lines[first - 1:last]):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return found


def test_a_project_import_inside_a_function_says_why_it_is_not_at_the_top():
    """The project's modules are imported at the top of a module, where the import graph shows; one kept inside a
    function (start-up time the user feels, a process that must answer before torch loads) says why in a comment."""
    paths = [ROOT / "app.py", *sorted((ROOT / "memvir").rglob("*.py")), *sorted((ROOT / "demo").rglob("*.py"))]
    assert [place for path in paths for place in _unexplained_local_imports(path)] == []
