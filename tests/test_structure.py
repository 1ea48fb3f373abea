"""The package layout's rules: dependencies run one way, no import cycles, local imports explained.

core (`disan/`) <- `model_export/` <- `service/` <- `bench/`: a module may import only from its own
layer or the layers before it. Inside `service/` the same rule holds between its layers (see
SERVICE_LAYERS). Read from the source (AST), so a violation fails here even if it sits in a
function that no other test calls.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LAYERS = ["disan", "model_export", "service", "bench"]
# service/'s layers, lowest first, like text-embeddings-inference's backends <- core <- router: the
# HTTP front may use the engine and the backend, never the other way round.
SERVICE_LAYERS = [
    ["service", "service.common"],  # the package docstring; errors, timing, metrics, batching defaults
    ["service.settings"],
    ["service.backend"],  # the runtime, the micro-batcher, the shared inference process
    ["service.inference"],  # the engine, admission
    ["service.http"],  # routes, fast path, ASGI, schemas
    ["service.main", "service.cli"],  # entry points: the app factory, `disan serve`
]


def modules() -> dict[str, Path]:
    return {".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"): p
            for layer in LAYERS for p in (ROOT / layer).rglob("*.py")}


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


def test_readme_layout_names_every_module() -> None:
    """The README's layout section lists each module of the three packages (and nothing gone)."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    layout = readme[readme.index("### Layout"):readme.index("### Data flow")]
    missing = [p.relative_to(ROOT).as_posix() for pkg in ("disan", "model_export", "service")
               for p in sorted((ROOT / pkg).rglob("*.py"))
               if p.name != "__init__.py" and p.name not in layout]
    assert not missing, f"modules missing from README's layout: {missing}"
