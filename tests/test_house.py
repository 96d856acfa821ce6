"""The house rules a newcomer can rely on (next to tests/test_import_graph.py's: no import cycles):

  - no module reaches another module's underscore name, by import or as a module's attribute: what
    crosses a module boundary is public
  - no function longer than 80 lines, and the decoding loop's module at most 600
  - no function takes more than 10 positional parameters (the rest are keyword-only)
  - a first-party import inside a function says why in a comment (on its line or the line above)
  - the loop never asks which drafter it has (pipeline/decoding/drafters/base.py is all it knows)
  - docs/layout.md names every module and package of the tree, and nothing that is not there
  - pyproject.toml installs every package of the tree (a plain `pip install .` has no editable finder to fall back on)
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from test_import_graph import PACKAGES, modules

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: tomllib is 3.11's; tomli is its backport (a dev dependency there)
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
MAX_FUNCTION_LINES = 80
MAX_LOOP_LINES = 600
MAX_POSITIONAL = 10


def _trees():
    for name, path in sorted(modules().items()):
        yield name, path, ast.parse(path.read_text(encoding="utf-8"))


def _absolute(node: ast.ImportFrom, name: str, path: Path) -> str:
    """The module an ``ImportFrom`` in module ``name`` (file ``path``) reads from, relative imports resolved."""
    if not node.level:
        return node.module or ""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
    return ".".join([*anchor, node.module] if node.module else anchor)


def _private(attr: str) -> bool:
    return attr.startswith("_") and not attr.startswith("__")


def underscore_reaches(source: str, name: str, path: Path, known: set[str]) -> list[str]:
    """Where module ``name`` reaches another first-party module's underscore name: ``from m import _x`` (relative
    too), or ``m._x`` with ``m`` a name bound to a first-party module (``import a.b as m``, ``from a import m``,
    ``import a.b`` then ``a.b._x``). Attributes of objects (``obj._x``) are beyond what a parse can tell."""
    tree = ast.parse(source)
    found, bound = [], {}                 # bound: local name -> the first-party module (or package prefix) it names
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = _absolute(node, name, path)
            for alias in node.names:
                target = f"{base}.{alias.name}"
                if target in known:
                    bound[alias.asname or alias.name] = target
                elif _private(alias.name) and base in known and base != name:
                    found.append(f"{node.lineno}: from {base} import {alias.name}")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                top = alias.name.split(".")[0]
                if top in known:          # `import a.b as m` binds m to a.b; `import a.b` binds a
                    bound[alias.asname or top] = alias.name if alias.asname else top
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            parts, value = [], node.value
            while isinstance(value, ast.Attribute):
                parts.insert(0, value.attr)
                value = value.value
            if isinstance(value, ast.Name) and bound.get(value.id):
                module = ".".join([bound[value.id], *parts])
                if module in known and module != name:
                    found.append(f"{node.lineno}: {ast.unparse(node)} ({module})")
    return found


def test_the_underscore_check_sees_imports_and_module_attributes():
    known = {"pipeline", "pipeline.a", "pipeline.b", "pipeline.pkg", "pipeline.pkg.c"}
    source = ("import pipeline.a\nimport pipeline.b as bee\nfrom pipeline.pkg import c\nfrom . import c as see\n"
              "from .c import _hidden, shown\n\ndef f(obj):\n    from pipeline.a import _late\n"
              "    return pipeline.a._x, bee._y, c._z, see._w, obj._fine, c.shown, bee.__name__\n")
    found = underscore_reaches(source, "pipeline.pkg.d", ROOT / "pipeline" / "pkg" / "d.py", known)
    assert [f.split(": ", 1)[1].split(" (")[0] for f in found] == [
        "from pipeline.pkg.c import _hidden", "from pipeline.a import _late", "pipeline.a._x", "bee._y", "c._z",
        "see._w"], found


def test_no_module_reaches_another_modules_underscore_name():
    known = set(modules())
    crossing = [f"{path.relative_to(ROOT)}:{finding}" for name, path in sorted(modules().items())
                for finding in underscore_reaches(path.read_text(encoding="utf-8"), name, path, known)]
    assert not crossing, crossing


def uncommented_local_imports(source: str) -> list[int]:
    """Lines of first-party imports inside a function (``pipeline...`` or relative) that carry no comment saying
    why: none on the import's lines, none on the line above."""
    lines = source.splitlines()
    found = []
    for fn in ast.walk(ast.parse(source)):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(fn):
            if isinstance(node, ast.Import):
                first_party = any(a.name.split(".")[0] == "pipeline" for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                first_party = node.level > 0 or (node.module or "").split(".")[0] == "pipeline"
            else:
                continue
            said = any("#" in line for line in lines[node.lineno - 1: node.end_lineno]) or \
                (node.lineno > 1 and lines[node.lineno - 2].strip().startswith("#"))
            if first_party and not said:
                found.append(node.lineno)
    return sorted(set(found))          # a function inside a function is walked twice


def test_the_local_import_check_wants_a_comment_on_the_line_or_above():
    source = ("import pipeline.io\n\ndef f():\n    from pipeline import data\n    import json\n"
              "    from pipeline.x import y  # kept local: why\n    # why, above\n    from .z import w\n"
              "    def g():\n        import pipeline.stack\n")
    assert uncommented_local_imports(source) == [4, 10]


def test_every_first_party_local_import_says_why():
    bare = [f"{path.relative_to(ROOT)}:{line}" for _, path, _ in _trees()
            for line in uncommented_local_imports(path.read_text(encoding="utf-8"))]
    assert not bare, f"function-local first-party imports without a comment saying why: {bare}"


def test_functions_stay_short_and_the_loop_fits_one_module():
    long = [f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)"
            for _, path, tree in _trees() for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES]
    assert not long, long
    loop = ROOT / "pipeline" / "decoding" / "engine.py"
    assert len(loop.read_text(encoding="utf-8").splitlines()) <= MAX_LOOP_LINES


def test_no_function_takes_more_than_ten_positional_parameters():
    """Beyond ten, a call site is a row of bare values (`f(t, d, s, 3, "cpu", [], 0, ...)`) that reads wrong without
    failing: the rest are keyword-only (after a `*`)."""
    wide = []
    for _, path, tree in _trees():
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                params = [a.arg for a in (*node.args.posonlyargs, *node.args.args)]
                n = len(params) - (params[:1] in (["self"], ["cls"]))
                if n > MAX_POSITIONAL:
                    wide.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({n} positional)")
    assert not wide, wide


def test_the_loop_never_asks_which_drafter_it_has():
    source = (ROOT / "pipeline" / "decoding" / "engine.py").read_text(encoding="utf-8")
    tree = ast.parse(source)
    asks = [node.lineno for node in ast.walk(tree) if isinstance(node, ast.Call) and getattr(node.func, "id", "")
            in ("getattr", "hasattr") and "drafter" in ast.unparse(node.args[0])]
    assert not asks, f"pipeline/decoding/engine.py asks its drafter what it is at lines {asks}"
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} | \
        {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    asked = names & {"reads_text", "bridge", "bridge_mode", "TextDrafter", "LookupDrafter"}
    assert not asked, f"pipeline/decoding/engine.py names {sorted(asked)}"
    kinds = [node.lineno for node in ast.walk(tree) if isinstance(node, ast.Call) and getattr(node.func, "id", "")
             == "isinstance" and "drafter" in ast.unparse(node.args[0])]
    assert not kinds, f"pipeline/decoding/engine.py checks its drafter's class at lines {kinds}"


def test_layout_doc_names_every_module_and_nothing_else():
    doc = (ROOT / "docs" / "layout.md").read_text(encoding="utf-8")
    named = set(re.findall(r"`([\w/.]+\.py|[\w/]+/)`", doc))
    files = {str(path.relative_to(ROOT)) for folder in PACKAGES.values() for path in folder.rglob("*.py")
             if path.name != "__init__.py"}
    packages = {str(path.parent.relative_to(ROOT)) + "/" for folder in PACKAGES.values()
                for path in folder.rglob("__init__.py")}
    missing = sorted(f for f in files | packages if f not in named)
    assert not missing, f"docs/layout.md does not name {missing}"
    gone = sorted(n for n in named if n.startswith(("pipeline/", "kernels/", "analysis/")) and not (ROOT / n).exists())
    assert not gone, f"docs/layout.md names {gone}, which are not in the tree"


def test_pyproject_installs_every_package_of_the_tree():
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]["packages"])
    tree = {".".join((package, *path.parent.relative_to(folder).parts))
            for package, folder in PACKAGES.items() for path in folder.rglob("__init__.py")}
    assert not tree - listed, f"pyproject.toml does not install {sorted(tree - listed)}"
    assert not listed - tree, f"pyproject.toml lists {sorted(listed - tree)}, which are not in the tree"
