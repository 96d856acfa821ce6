"""No import cycles among specsweep's own modules, counting imports inside functions too (a lazy import still
makes two modules depend on each other; issue "one owner per concept")."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# installed package name -> source folder (pyproject.toml's package-dir)
PACKAGES = {"pipeline": ROOT / "pipeline", "pipeline.kernels": ROOT / "kernels", "pipeline.analysis": ROOT / "analysis"}


def modules() -> dict[str, Path]:
    """Every first-party module name -> its file."""
    out = {}
    for package, folder in PACKAGES.items():
        for path in folder.rglob("*.py"):
            parts = path.relative_to(folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join((package, *parts))] = path
    return out


def imports_of(path: Path, name: str, known: set[str]) -> set[str]:
    """First-party modules that the module ``name`` (file ``path``) imports anywhere in its body."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            # `from pipeline import tune` imports the module pipeline.tune; `from pipeline.tune import x` the module
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name and not name.startswith(target + "."):  # a module's own package: fine
                found.add(target)
    return found


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as [a, b, ..., a], or None."""
    state: dict[str, int] = {}   # 1 = on the current path, 2 = done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt):], nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_the_cycle_finder_finds_a_cycle_and_accepts_a_tree():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_lazy_imports_count_as_edges(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("def g():\n    from pipeline.tune import tradeoff\n    import pipeline.io\n")
    assert imports_of(f, "pipeline.x", {"pipeline", "pipeline.tune", "pipeline.io", "pipeline.x"}) == {
        "pipeline.tune", "pipeline.io"}


def test_no_import_cycles_among_first_party_modules():
    mods = modules()
    known = set(mods)
    graph = {name: imports_of(path, name, known) for name, path in mods.items()}
    cycle = find_cycle(graph)   # (imports_of leaves out a module's edges to its own parent packages)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


# the floors above the run settings: what reads a RunConfig, never what it reads
UPPER_FLOORS = ("pipeline.tuning", "pipeline.commands", "pipeline.serving", "pipeline.benchmarks", "pipeline.analysis",
                "pipeline.runner", "pipeline.stack", "pipeline.cli")


def test_the_run_settings_reach_no_upper_floor():
    """pipeline.config (RunConfig) is read by the runner, the tuner, the server and the commands; nothing it imports,
    directly or through another module, lazily or not, may be one of them."""
    mods = modules()
    known = set(mods)
    graph = {name: imports_of(path, name, known) for name, path in mods.items()}
    reached, todo = set(), ["pipeline.config"]
    while todo:
        for nxt in graph[todo.pop()] - reached:
            reached.add(nxt)
            todo.append(nxt)
    upper = sorted(m for m in reached if m.startswith(UPPER_FLOORS))
    assert not upper, f"pipeline.config reaches up to {upper}"
