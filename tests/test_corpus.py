"""A corpus of bad and odd inputs, generated here, each with the behaviour it must get.

docs/RELIABILITY.md has the same table in prose. Outcomes: "ok" (compiled, pixels checked against the
reference decode), "skip" (left out with --on-error skip, reason recorded; --on-error fail stops naming
the file), "ignored" (not an input by the ImageFolder rules).
"""
import os
import shutil
import struct
import subprocess
import sys
import zlib

import numpy as np
import pytest
from PIL import Image

import dsc
from dsc.synthetic import make_scene
from reference import reference

RNG = np.random.default_rng(0)


def scene(h=40, w=56):
    return make_scene(np.random.default_rng(h * 1000 + w), h, w)


def _png_with_size(path, width, height):
    """A valid PNG whose header declares width x height (a decompression bomb when large)."""
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
    ihdr = struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0)
    idat = zlib.compress(b"\x00" * 64)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat) + chunk(b"IEND", b""))


def make(kind, d):
    """Write the input of one case into class folder d; returns the file name (key suffix)."""
    if kind == "zero_bytes":
        (d / "a.jpg").write_bytes(b"")
    elif kind == "truncated_jpeg":
        scene().save(d / "a.jpg", quality=90)
        data = (d / "a.jpg").read_bytes()
        (d / "a.jpg").write_bytes(data[: len(data) * 2 // 3])
    elif kind == "truncated_png":
        scene().save(d / "a.png")
        data = (d / "a.png").read_bytes()
        (d / "a.png").write_bytes(data[: len(data) // 2])
    elif kind == "random_bytes":
        (d / "a.jpg").write_bytes(RNG.integers(0, 256, 5000, dtype=np.uint8).tobytes())
    elif kind == "text_as_jpg":
        (d / "a.jpg").write_text("this is not an image\n" * 20)
    elif kind == "png_named_jpg":
        scene().save(d / "a.jpg", format="PNG")
    elif kind == "cmyk_jpeg":
        scene().convert("CMYK").save(d / "a.jpg")
    elif kind == "png_16bit":
        Image.fromarray(np.arange(40 * 56, dtype=np.uint16).reshape(40, 56) * 29).save(d / "a.png")
    elif kind == "palette_transparency":
        scene().convert("P", palette=Image.Palette.ADAPTIVE, colors=8).save(d / "a.png", transparency=2)
    elif kind == "la":
        scene().convert("LA").save(d / "a.png")
    elif kind == "bilevel":
        scene().convert("1").save(d / "a.png")
    elif kind.startswith("exif_"):
        exif = Image.Exif()
        exif[0x0112] = int(kind[-1])
        scene(30, 50).save(d / "a.jpg", exif=exif, quality=95)
    elif kind == "one_pixel":
        scene(1, 1).save(d / "a.png")
    elif kind == "decompression_bomb":
        _png_with_size(d / "a.png", 30000, 30000)
    elif kind == "unicode_space_name":
        scene().save(d / "été à l'ombre 影.png")
        return "été à l'ombre 影.png"
    elif kind == "symlink_followed":
        scene().save(d.parent / "outside.png")
        os.symlink(d.parent / "outside.png", d / "a.png")
    elif kind == "dangling_symlink":
        os.symlink(d / "nowhere.png", d / "a.png")
    elif kind == "symlink_loop":
        scene().save(d / "a.png")
        os.symlink(d, d / "loop")
    elif kind == "duplicated_files":
        scene().save(d / "a.png")
        shutil.copy(d / "a.png", d / "b.png")
    elif kind == "float_tiff":
        Image.fromarray(np.random.default_rng(1).random((20, 20), dtype=np.float32), "F").save(d / "a.tif")
        return "a.tif"
    elif kind == "directory_named_jpg":
        (d / "a.jpg").mkdir()
        scene().save(d / "real.png")
        return "real.png"
    elif kind == "hidden_and_text_files":
        scene().save(d / ".hidden.png")
        (d / "notes.txt").write_text("x")
        scene().save(d / "real.png")
        return "real.png"
    for name in ("a.jpg", "a.png"):
        if (d / name).exists() or (d / name).is_symlink():
            return name
    raise AssertionError(kind)


# case -> (outcome, reason substring for skips)
CASES = {
    "zero_bytes": ("skip", "cannot identify image file"),
    "truncated_jpeg": ("skip", "truncated"),
    "truncated_png": ("skip", "cannot decode image"),
    "random_bytes": ("skip", "cannot identify image file"),
    "text_as_jpg": ("skip", "cannot identify image file"),
    "png_named_jpg": ("ok", None),
    "cmyk_jpeg": ("ok", None),
    "png_16bit": ("ok", None),
    "palette_transparency": ("ok", None),
    "la": ("ok", None),
    "bilevel": ("ok", None),
    **{f"exif_{k}": ("ok", None) for k in range(1, 9)},
    "one_pixel": ("ok", None),
    "decompression_bomb": ("skip", "--max-pixels"),
    "unicode_space_name": ("ok", None),
    "symlink_followed": ("ok", None),
    "dangling_symlink": ("skip", "No such file"),
    "symlink_loop": ("ok", None),
    "duplicated_files": ("ok", None),
    "float_tiff": ("skip", "mode F"),
    "directory_named_jpg": ("ok", None),
    "hidden_and_text_files": ("ok", None),
}


@pytest.mark.parametrize("kind", list(CASES))
def test_corpus_case(tmp_path, kind):
    outcome, reason = CASES[kind]
    src = tmp_path / "src"
    d = src / "c"
    d.mkdir(parents=True)
    name = make(kind, d)
    scene().save(src / "c" / "zz_good.png")  # every case also holds a good image
    out = tmp_path / "out"
    report = dsc.compile_imagefolder(src, out, size=(24, 32), on_error="skip", progress=False, workers=1)
    ds = dsc.open(out)
    key = f"c/{name}"
    if outcome == "ok":
        assert key in ds.keys and not report.skipped
        i = ds.keys.index(key)
        want, _ = reference(src / key, size=(24, 32))
        np.testing.assert_array_equal(ds[i]["image"].numpy(), want)
        if kind == "duplicated_files":
            assert ds.keys == ["c/a.png", "c/b.png", "c/zz_good.png"]
        if kind == "symlink_loop":
            assert ds.keys == ["c/a.png", "c/zz_good.png"]
        if kind == "hidden_and_text_files" or kind == "directory_named_jpg":
            assert ds.keys == ["c/real.png", "c/zz_good.png"]
    else:
        assert ds.keys == ["c/zz_good.png"]
        assert [s["key"] for s in report.skipped] == [key]
        assert reason in report.skipped[0]["reason"], report.skipped[0]["reason"]
        with pytest.raises(dsc.SampleError) as e:  # the default policy stops, naming the file
            dsc.compile_imagefolder(src, tmp_path / "out2", size=(24, 32), progress=False, workers=1)
        assert name in str(e.value) and reason in str(e.value)
        assert not (tmp_path / "out2").exists()


def test_corpus_has_at_least_twenty_kinds():
    assert len(CASES) >= 20


def test_exif_orientations_land_upright(tmp_path):
    """All eight orientations of the same picture compile to the same upright image."""
    base = np.zeros((30, 50, 3), np.uint8)
    base[:10, :20] = (255, 0, 0)  # a red block in the top-left corner of the upright picture
    to_raw = {2: [Image.Transpose.FLIP_LEFT_RIGHT], 3: [Image.Transpose.ROTATE_180],
              4: [Image.Transpose.FLIP_TOP_BOTTOM], 5: [Image.Transpose.TRANSPOSE], 6: [Image.Transpose.ROTATE_90],
              7: [Image.Transpose.TRANSVERSE], 8: [Image.Transpose.ROTATE_270]}
    src = tmp_path / "src" / "c"
    src.mkdir(parents=True)
    for o in range(1, 9):
        im = Image.fromarray(base)
        for t in to_raw.get(o, []):
            im = im.transpose(t)
        exif = Image.Exif()
        exif[0x0112] = o
        im.save(src / f"o{o}.png", exif=exif)
    dsc.compile_imagefolder(tmp_path / "src", tmp_path / "out", progress=False)
    ds = dsc.open(tmp_path / "out")
    for i in range(8):
        np.testing.assert_array_equal(ds[i]["image"].numpy(), base, err_msg=ds.keys[i])
    assert ds.orig_sizes.tolist() == [[30, 50]] * 8


def test_unreadable_file(tmp_path_factory):
    """A file the compiling user may not read is skipped with the OS's reason (run as 'nobody' when we
    are root, since root reads anything)."""
    import tempfile
    from pathlib import Path

    tmp_path = Path(tempfile.mkdtemp(prefix="dsc-perm-"))
    try:
        _unreadable(tmp_path)
    finally:
        shutil.rmtree(tmp_path, ignore_errors=True)


def _unreadable(tmp_path):
    os.chmod(tmp_path, 0o777)
    src = tmp_path / "src" / "c"
    src.mkdir(parents=True)
    scene().save(src / "locked.png")
    scene().save(src / "open.png")
    os.chmod(src / "locked.png", 0o000)
    if os.geteuid() != 0:
        report = dsc.compile_imagefolder(tmp_path / "src", tmp_path / "out", size=16, on_error="skip",
                                         progress=False)
        assert [s["key"] for s in report.skipped] == ["c/locked.png"]
        return
    if not shutil.which("setpriv"):
        pytest.skip("running as root without setpriv: cannot drop privileges to test permissions")
    os.chmod(tmp_path, 0o777)
    for p in tmp_path.rglob("*"):
        if p.name != "locked.png":
            os.chmod(p, 0o777 if p.is_dir() else 0o644)
    code = ("import dsc; r = dsc.compile_imagefolder(%r, %r, size=16, on_error='skip', progress=False);"
            "print([(s['key'], s['reason']) for s in r.skipped])") % (str(tmp_path / "src"), str(tmp_path / "out"))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.getcwd(), *sys.path]), "HOME": str(tmp_path)}
    r = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-c", code],
                       capture_output=True, text=True, env=env, cwd=str(tmp_path))
    if r.returncode != 0 and "Permission denied" in r.stderr and "locked" not in r.stderr:
        pytest.skip(f"cannot run as nobody here: {r.stderr.strip().splitlines()[-1]}")
    assert r.returncode == 0, r.stderr
    assert "c/locked.png" in r.stdout and "Permission denied" in r.stdout


def test_a_directory_reachable_twice_is_walked_once_whatever_the_listing_order(tmp_path):
    for order in ("a_first", "link_first"):
        root = tmp_path / order / "src"
        (root / "cls").mkdir(parents=True)
        if order == "link_first":
            os.symlink(root / "cls" / "a", root / "cls" / "b")
            (root / "cls" / "a").mkdir()
        else:
            (root / "cls" / "a").mkdir()
            os.symlink(root / "cls" / "a", root / "cls" / "b")
        scene().save(root / "cls" / "a" / "x.png")
        from dsc.compiler import scan_imagefolder

        assert [r.key for r in scan_imagefolder(root).records] == ["cls/a/x.png"], order


def test_malformed_sources_never_print_tracebacks(tmp_path):
    from click.testing import CliRunner

    from dsc.cli import main
    from dsc.synthetic import detection_scenes, write_voc, write_yolo

    scenes = detection_scenes(3, seed=1)
    y = write_yolo(tmp_path / "y", scenes)
    lbl = sorted((y / "labels" / "train").glob("*.txt"))[0]
    lbl.write_text("nan 0.5 0.5 0.1 0.1\n")
    v = write_voc(tmp_path / "v", scenes)
    xml = sorted((v / "Annotations").glob("*.xml"))[0]
    xml.write_text(xml.read_text().replace("<difficult>1</difficult>", "<difficult>maybe</difficult>"))
    os.symlink(y / "images" / "train", y / "images" / "train" / "loop")  # a symlink loop in a YOLO split
    bad_json = tmp_path / "bad.dsc"
    bad_json.mkdir()
    (bad_json / "zarr.json").write_text("[1, 2]")
    cases = [
        (["compile", "yolo", str(y), str(tmp_path / "o1"), "-q"], f"{lbl.name}:1: class nan"),
        (["compile", "voc", str(v), str(tmp_path / "o2"), "-q"], "<difficult> is 'maybe'"),
        (["info", str(bad_json)], "not a dsc dataset"),
        (["verify", str(bad_json)], "not a dsc dataset"),
        (["compile", "imagefolder", str(tmp_path), ".", "-q"], "not a name for a new dataset directory"),
    ]
    for args, needle in cases:
        r = CliRunner().invoke(main, args)
        assert r.exit_code == 1 and needle in r.output and "Traceback" not in r.output, (args, r.output)
        assert r.exception is None or isinstance(r.exception, SystemExit), (args, r.exception)
    lbl.write_text("0 0.5 0.5 0.1 0.1\n")
    from dsc.compiler import scan_yolo

    assert len(scan_yolo(y).records) == 3  # the loop adds nothing


def test_boxes_thinner_than_float32_are_dropped():
    from dsc.compiler.boxes import to_stored

    boxes = np.array([[1000.0, 0, 1000.00001, 10], [0, 0, 10, 10]])
    stored, keep = to_stored(boxes, (1.0, 1.0, 0.0, 0.0), 2000, 2000)
    assert keep.tolist() == [False, True] and stored.dtype == np.float32
