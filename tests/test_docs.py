"""The docs name what the code has: every ``dsc.X`` and ``T.X`` (dsc.transforms) that README.md and docs/*.md
write is there (a name or a module), and every error of the tree (``dsc/errors.py``) is one a user can catch as ``dsc.X``."""
import importlib.util
import re
from pathlib import Path

import dsc
from dsc import errors
from dsc import transforms as T

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _named(prefix: str):
    """(file, line, name) of every ``prefix.Name`` in the docs (the first name after the dot)."""
    for path in DOCS:
        for n, line in enumerate(path.read_text().splitlines(), 1):
            for m in re.finditer(rf"(?<![\w.]){re.escape(prefix)}\.([A-Za-z_]\w*)", line):
                yield path.name, n, m.group(1)


def test_every_dsc_and_transforms_name_the_docs_write_exists():
    from dsc.compiler import all_sources

    missing = []
    for prefix, module in (("dsc", dsc), ("T", T)):
        for where, n, name in _named(prefix):
            if prefix == "dsc" and name.startswith("compile_"):  # one a source: ``dsc.compile_<name>``
                if name == "compile_" or name[8:] in all_sources() or name == "compile_textlist":  # (PLUGINS.md's)
                    continue
            if not hasattr(module, name) and importlib.util.find_spec(f"{module.__name__}.{name}") is None:
                missing.append(f"{where}:{n}: {prefix}.{name}")
    assert not missing, missing


def test_every_error_of_the_tree_is_dscs_own_name():
    tree = [n for n, v in vars(errors).items() if isinstance(v, type) and issubclass(v, errors.DscError)]
    assert len(tree) > 15
    assert [n for n in tree if getattr(dsc, n, None) is not getattr(errors, n) or n not in dsc.__all__] == []
