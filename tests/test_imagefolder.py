"""The ImageFolder source follows torchvision's documented convention."""
import os

import pytest

from conftest import MIXED_IMAGES
from dsc.compiler import scan_imagefolder
from dsc.compiler.sources.imagefolder import IMG_EXTENSIONS
from dsc.errors import SourceError


def test_torchvision_rules(mixed_src):
    s = scan_imagefolder(mixed_src)
    assert s.classes == ("cat", "dog", "empty")  # sorted sub-folders, hidden ones ignored
    assert [r.key for r in s.records] == MIXED_IMAGES  # sorted walk, nested folders, any-case extensions
    assert all(r.path == os.path.join(mixed_src, r.key) for r in s.records)
    assert any("empty" in w for w in s.warnings)


def test_extensions_are_torchvisions():
    assert IMG_EXTENSIONS == (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


def test_class_order_is_lexicographic(tmp_path):
    for name in ["b", "B", "a10", "a2", "_x"]:
        (tmp_path / name).mkdir()
        (tmp_path / name / "i.png").write_bytes(b"")
    assert scan_imagefolder(tmp_path).classes == ("B", "_x", "a10", "a2", "b")


def test_symlink_loop_is_walked_once(tmp_path):
    (tmp_path / "c" / "d").mkdir(parents=True)
    (tmp_path / "c" / "d" / "i.jpg").write_bytes(b"")
    os.symlink(tmp_path / "c", tmp_path / "c" / "d" / "loop")
    assert [r.key for r in scan_imagefolder(tmp_path).records] == ["c/d/i.jpg"]


@pytest.mark.parametrize("layout,msg", [
    ("missing", "no such directory"),
    ("file", "not a directory"),
    ("empty", "no class folders"),
    ("noimages", "no image files"),
])
def test_bad_roots(tmp_path, layout, msg):
    root = tmp_path / "src"
    if layout == "file":
        root.write_text("x")
    elif layout == "empty":
        root.mkdir()
    elif layout == "noimages":
        (root / "a").mkdir(parents=True)
        (root / "a" / "x.txt").write_text("x")
    with pytest.raises(SourceError, match=msg):
        scan_imagefolder(root)
