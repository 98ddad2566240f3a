"""dsc's own imports, read with ast (module level and inside functions): no circle anywhere, every import
points down the layers of docs/architecture.md, and an import inside a function is there only to defer a
heavy or optional dependency, saying so on its line (``# lazy: <why>``)."""
import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "dsc"

# docs/architecture.md: errors <- store <- formats <- compiler / runtime / transforms <- versions, CLI
LAYERS = {"dsc._version": 0, "dsc.errors": 0, "dsc.progress": 0, "dsc.scratch": 0, "dsc.nogil": 0, "dsc.store": 1, "dsc.formats": 2, "dsc.env": 2, "dsc.compiler": 3, "dsc.runtime": 3,
          "dsc.transforms": 3, "dsc.synthetic": 4, "dsc.versions": 4, "dsc.bench": 5, "dsc.demo": 6, "dsc.cli": 6,
          "dsc": 6}


def _modules() -> dict[str, Path]:
    return {".".join(p.relative_to(PKG.parent).with_suffix("").parts).removesuffix(".__init__"): p
            for p in PKG.rglob("*.py")}


def _layer(mod: str) -> int:
    best = None
    for prefix, n in LAYERS.items():
        if (mod == prefix or mod.startswith(prefix + ".")) and (best is None or len(prefix) > len(best[0])):
            best = (prefix, n)
    assert best is not None, f"{mod} has no layer in LAYERS (docs/architecture.md): add it"
    return best[1]


def _imports():
    """(importer, imported module, line, inside a function?, the line's text, of an enclosing package?) for every
    import of dsc's own. (Python imports a module's enclosing packages first whatever it imports, so such an
    import makes no circle of its own; it still must not point up the layers.)"""
    mods = _modules()
    out = []
    for mod, path in mods.items():
        text = path.read_text()
        lines = text.splitlines()
        tree = ast.parse(text, str(path))
        inside = set()
        for fn in ast.walk(tree):
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                inside |= {id(n) for n in ast.walk(fn) if isinstance(n, (ast.Import, ast.ImportFrom))}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = mod.split(".") if path.name == "__init__.py" else mod.split(".")[:-1]
                    root = ".".join(base[:len(base) - node.level + 1] + ([node.module] if node.module else []))
                else:
                    root = node.module or ""
                names = [f"{root}.{a.name}" if f"{root}.{a.name}" in mods else root for a in node.names]
            else:
                continue
            for name in names:
                while name and name not in mods:
                    name = name.rpartition(".")[0]
                if not name or name == mod:
                    continue
                parent = mods[name].name == "__init__.py" and mod.startswith(name + ".")
                out.append((mod, name, node.lineno, id(node) in inside, lines[node.lineno - 1], parent))
    return out


def test_no_import_circle():
    import graphlib

    edges: dict[str, set] = {}
    for a, b, *_, parent in _imports():
        if not parent:
            edges.setdefault(a, set()).add(b)
    try:
        graphlib.TopologicalSorter(edges).prepare()
    except graphlib.CycleError as e:
        raise AssertionError(f"an import circle: {' -> '.join(e.args[1])}") from None


def test_imports_point_down_the_layers():
    up = [f"{a} (layer {_layer(a)}) imports {b} (layer {_layer(b)}), line {line}"
          for a, b, line, *_ in _imports() if _layer(b) > _layer(a)]
    assert not up, "imports that point up: the thing belongs lower\n" + "\n".join(up)


def test_an_import_inside_a_function_says_why():
    silent = [f"{a}:{line}: {text.strip()}" for a, b, line, inside, text, _ in _imports()
              if inside and "# lazy:" not in text]
    assert not silent, ("imports of dsc's own modules inside functions without '# lazy: <why>' (only to defer a "
                        "heavy or optional dependency; otherwise import at the top)\n" + "\n".join(silent))
