"""The package layout's rules: dependencies run one way, no import cycles, local imports explained.

core (`disan/`) <- `model_export/` <- `service/` <- `bench/` <- `research/`: a module may import
only from its own layer or the layers before it. Inside `disan/` (DISAN_LAYERS) and `service/`
(SERVICE_LAYERS) the same rule holds between their packages. Read from the source (AST), so a
violation fails here even if it sits in a function that no other test calls. No folder of the
wheel holds more than MAX_MODULES modules.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LAYERS = ["disan", "model_export", "service", "bench", "research"]
WHEEL = ["disan", "model_export", "service"]  # pyproject's packages.find
MAX_MODULES = 15  # per folder of the wheel: more reads as a heap, not a package
# disan/'s packages, lowest first (the order in disan/__init__.py's docstring): a module may import
# its own package and those of a lower rank, never one above it nor a sibling of the same rank.
# `disan.optional` (optional imports -> one-line hints) serves every layer.
DISAN_LAYERS = [
    ["disan.optional"],
    ["disan.text"],
    ["disan.model"],
    ["disan.bundle"],
    ["disan.runtime"],
    ["disan.embed", "disan.data"],
    ["disan.train"],
    ["disan.distill"],
    ["disan.eval"],
    ["disan", "disan.cli"],  # the package (`disan.Encoder`) and the console script
]
PENDING: dict[str, str] = {}
# service/'s layers, lowest first, like text-embeddings-inference's backends <- core <- router: the
# HTTP front may use the engine and the backend, never the other way round.
SERVICE_LAYERS = [
    ["service", "service.common"],  # the package docstring; errors, timing, metrics, batching defaults
    ["service.settings"],
    ["service.backend"],  # the runtime, the micro-batcher
    ["service.inference"],  # the engine, admission
    ["service.http"],  # routes, fast path, ASGI, schemas
    ["service.main", "service.cli"],  # entry points: the app factory, `disan serve`
]


def modules() -> dict[str, Path]:
    """Every module of the layers (research's tests are tests, not a layer)."""
    return {".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"): p
            for layer in LAYERS for p in (ROOT / layer).rglob("*.py")
            if not p.relative_to(ROOT).as_posix().startswith("research/tests/")}


def imports(path: Path, ours: bool = True) -> list[tuple[str, ast.AST, bool]]:
    """(imported module, node, inside a function) for each import (of our own packages only,
    unless `ours` is False)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = []

    def visit(node: ast.AST, local: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inner = local or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef)
            if isinstance(child, ast.Import):
                found.extend((a.name, child, inner) for a in child.names)
            elif isinstance(child, ast.ImportFrom) and child.module and child.level == 0:
                found.append((child.module, child, inner))
            visit(child, inner)

    visit(tree, False)
    return [(m, n, loc) for m, n, loc in found if not ours or m.split(".")[0] in LAYERS]


def test_dependencies_point_one_way() -> None:
    wrong = []
    for name, path in modules().items():
        rank = LAYERS.index(name.split(".")[0])
        for target, node, _ in imports(path):
            if LAYERS.index(target.split(".")[0]) > rank:
                wrong.append(f"{path.relative_to(ROOT)}:{node.lineno} imports {target}")
    assert not wrong, "imports against the layer order disan <- model_export <- service <- bench:\n" + \
        "\n".join(wrong)


def disan_place(module: str) -> tuple[int, str] | None:
    """(rank, package) of a disan module by the longest prefix in DISAN_LAYERS, None if unplaced."""
    module = next((pkg for mod, pkg in PENDING.items() if module == mod or module.startswith(mod + ".")),
                  module)
    found = [(len(prefix), rank, prefix) for rank, prefixes in enumerate(DISAN_LAYERS) for prefix in prefixes
             if module == prefix or module.startswith(prefix + ".") and prefix != "disan"]
    if not found:
        return (len(DISAN_LAYERS) - 1, "disan") if module == "disan" else None
    _, rank, prefix = max(found)
    return rank, prefix


def test_every_disan_module_has_a_layer() -> None:
    unplaced = [name for name in modules() if name.split(".")[0] == "disan" and disan_place(name) is None]
    assert not unplaced, f"disan modules in no layer of DISAN_LAYERS: {unplaced}"


def test_disan_packages_point_one_way() -> None:
    """`import disan` itself (the package, as every submodule import does) is always allowed."""
    wrong = []
    for name, path in modules().items():
        if name.split(".")[0] != "disan":
            continue
        rank, package = disan_place(name)
        for target, node, _ in imports(path):
            if target.split(".")[0] != "disan" or target == "disan":
                continue
            target_rank, target_package = disan_place(target)
            if target_rank > rank or (target_rank == rank and target_package != package):
                wrong.append(f"{path.relative_to(ROOT)}:{node.lineno} imports {target}")
    assert not wrong, "imports against disan's package order (" + " <- ".join(
        "/".join(layer) for layer in DISAN_LAYERS) + "):\n" + "\n".join(wrong)


def test_no_folder_of_the_wheel_is_a_heap() -> None:
    folders = {p.parent for pkg in WHEEL for p in (ROOT / pkg).rglob("*.py")}
    heaps = {f.relative_to(ROOT).as_posix(): n for f in folders
             if (n := len([p for p in f.glob("*.py") if p.name != "__init__.py"])) > MAX_MODULES}
    assert not heaps, f"folders with more than {MAX_MODULES} modules: {heaps}"


def test_every_package_says_what_it_owns() -> None:
    """Each package of the wheel opens with a docstring (what it owns, what it may import)."""
    silent = [p.relative_to(ROOT).as_posix() for pkg in WHEEL for p in (ROOT / pkg).rglob("__init__.py")
              if not ast.get_docstring(ast.parse(p.read_text(encoding="utf-8")))]
    assert not silent, f"packages without a docstring: {silent}"


def test_the_cli_top_level_is_the_product() -> None:
    """`disan --help` lists at most 9 commands, none of them research (`python -m research`)."""
    from disan.cli import ALIASES, COMMANDS, GROUPS

    assert len(COMMANDS) <= 9, list(COMMANDS)
    modules_named = [spec[0] for spec in COMMANDS.values()] + [spec[0] for steps in GROUPS.values()
                                                              for spec in steps.values()]
    assert not [m for m in modules_named if m.split(".")[0] not in WHEEL], modules_named
    assert all(ALIASES[name][0] in GROUPS for name in ALIASES)


def test_research_stays_out_of_the_wheel() -> None:
    import tomllib

    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    include = config["tool"]["setuptools"]["packages"]["find"]["include"]
    assert not any(pattern.startswith("research") or pattern == "*" for pattern in include), include
    assert "research/tests" in config["tool"]["pytest"]["ini_options"]["testpaths"]


def test_errors_and_the_batcher_need_no_fastapi() -> None:
    """The error types and the micro-batcher import no web framework: their tests (and the
    engine) run without FastAPI; the HTTP mapping of the errors is service/http/errors.py."""
    web = {"fastapi", "starlette", "pydantic", "uvicorn"}
    for rel in ("service/common/errors.py", "service/backend/batcher.py"):
        found = {m.split(".")[0] for m, _, _ in imports(ROOT / rel, ours=False)} & web
        assert not found, f"{rel} imports {sorted(found)}"


def service_layer(module: str) -> int | None:
    """Rank of a service module's layer (the longest prefix in SERVICE_LAYERS), None if unplaced."""
    ranks = [(len(prefix), rank) for rank, prefixes in enumerate(SERVICE_LAYERS) for prefix in prefixes
             if module == prefix or module.startswith(prefix + ".") and prefix != "service"]
    return max(ranks)[1] if ranks else None


def test_every_service_module_has_a_layer() -> None:
    unplaced = [name for name in modules() if name.startswith("service") and service_layer(name) is None]
    assert not unplaced, f"service modules in no layer of SERVICE_LAYERS: {unplaced}"


def test_service_layers_point_one_way() -> None:
    wrong = []
    for name, path in modules().items():
        rank = service_layer(name) if name.startswith("service") else None
        if rank is None:
            continue
        for target, node, _ in imports(path):
            target_rank = service_layer(target) if target.split(".")[0] == "service" else None
            if target_rank is not None and target_rank > rank:
                wrong.append(f"{path.relative_to(ROOT)}:{node.lineno} imports {target}")
    assert not wrong, "imports against service's layers (" + " <- ".join(
        "/".join(layer) for layer in SERVICE_LAYERS) + "):\n" + "\n".join(wrong)


def test_no_import_cycles() -> None:
    mods = modules()
    graph = {name: {t for t, _, _ in imports(path) if t in mods} for name, path in mods.items()}
    state: dict[str, int] = {}
    cycles = []

    def walk(node: str, stack: list[str]) -> None:
        state[node] = 1
        for nxt in graph[node]:
            if state.get(nxt) == 1:
                cycles.append(" -> ".join(stack[stack.index(nxt):] + [nxt]))
            elif nxt not in state:
                walk(nxt, stack + [nxt])
        state[node] = 2

    for name in graph:
        if name not in state:
            walk(name, [name])
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_function_local_imports_say_why() -> None:
    """A function-local import must carry a comment (an optional dependency, start-up time, a
    child process); everything else is imported at the top."""
    silent = []
    for path in modules().values():
        lines = path.read_text(encoding="utf-8").splitlines()
        for _, node, local in imports(path, ours=False):
            nearby = lines[max(0, node.lineno - 4):node.end_lineno]  # the import or just above it
            if local and not any("#" in line for line in nearby):
                silent.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not silent, "local imports without a reason:\n" + "\n".join(silent)


def test_layout_page_names_every_module() -> None:
    """The layout section of docs/development.md lists each module of the three packages."""
    page = (ROOT / "docs" / "development.md").read_text(encoding="utf-8")
    layout = page[page.index("## Layout"):page.index("## Data flow")]
    missing = [p.relative_to(ROOT).as_posix() for pkg in ("disan", "model_export", "service")
               for p in sorted((ROOT / pkg).rglob("*.py"))
               if p.name != "__init__.py" and p.name not in layout]
    assert not missing, f"modules missing from the layout in docs/development.md: {missing}"


def test_tests_mirror_the_packages() -> None:
    """tests/<package path>/ holds the tests of that package (tests/repo/: the repository as a
    whole: docs, containers, manifests, this file); no test sits at the top of tests/, and test
    file names stay unique (pytest imports them by basename)."""
    top = ROOT / "tests"
    assert not sorted(p.name for p in top.glob("test_*.py")), "tests at the top of tests/"
    folders = {p.parent.relative_to(top).as_posix() for p in top.rglob("test_*.py")}
    unknown = sorted(f for f in folders if f != "repo" and not (ROOT / f).is_dir())
    assert not unknown, f"test folders with no package of that path: {unknown}"
    names = [p.name for p in [*top.rglob("test_*.py"), *(ROOT / "research/tests").glob("test_*.py")]]
    assert len(names) == len(set(names)), sorted({n for n in names if names.count(n) > 1})
