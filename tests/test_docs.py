"""The docs name what the code has: every ``dsc.X`` and ``T.X`` (dsc.transforms) that README.md and docs/*.md
write is there (each name of the dotted chain: an attribute or a module), and every error of the tree (``dsc/errors.py``) is one a user can catch as ``dsc.X``."""
import importlib
import importlib.util
import re
from pathlib import Path

import dsc
from dsc import errors
from dsc import transforms as T

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _named(prefix: str):
    """(file, line, names) of every ``prefix.Name.Sub...`` in the docs (the whole dotted chain)."""
    for path in DOCS:
        for n, line in enumerate(path.read_text().splitlines(), 1):
            for m in re.finditer(rf"(?<![\w.]){re.escape(prefix)}((?:\.[A-Za-z_]\w*)+)", line):
                yield path.name, n, m.group(1)[1:].split(".")


def _missing(module, names):
    """The first of ``names`` that ``module`` does not have, following the chain through attributes and
    submodules (``T.presets.classification``, ``dsc.Loader.state_dict``); None when every one is there."""
    obj = module
    for name in names:
        if hasattr(obj, name):
            obj = getattr(obj, name)
        elif hasattr(obj, "__path__") and importlib.util.find_spec(f"{obj.__name__}.{name}") is not None:
            obj = importlib.import_module(f"{obj.__name__}.{name}")
        else:
            return name
    return None


def test_every_dsc_and_transforms_name_the_docs_write_exists():
    from dsc.compiler import all_sources

    missing = []
    for prefix, module in (("dsc", dsc), ("T", T)):
        for where, n, names in _named(prefix):
            name = names[0]
            if prefix == "dsc" and name.startswith("compile_"):  # one a source: ``dsc.compile_<name>``
                if name == "compile_" or name[8:] in all_sources() or name == "compile_textlist":  # (PLUGINS.md's)
                    continue
            if _missing(module, names) is not None:
                missing.append(f"{where}:{n}: {prefix}.{'.'.join(names)} (no {_missing(module, names)})")
    assert not missing, missing


def test_every_error_of_the_tree_is_dscs_own_name():
    tree = [n for n, v in vars(errors).items() if isinstance(v, type) and issubclass(v, errors.DscError)]
    assert len(tree) > 15
    assert [n for n in tree if getattr(dsc, n, None) is not getattr(errors, n) or n not in dsc.__all__] == []
