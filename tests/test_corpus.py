"""A corpus of bad and odd inputs, generated here, each with the behaviour it must get.

docs/RELIABILITY.md has the same table in prose. Outcomes: "ok" (compiled, pixels checked against the
reference decode), "skip" (left out with --on-error skip, reason recorded; --on-error fail stops naming
the file), "ignored" (not an input by the ImageFolder rules).
"""
import io
import os
import shutil
import struct
import subprocess
import sys
import zlib

import numpy as np
import pytest
from PIL import Image, ImageFile, features

import dsc
from dsc.synthetic import make_scene
from reference import ref_decode, reference

RNG = np.random.default_rng(0)


def scene(h=40, w=56):
    return make_scene(np.random.default_rng(h * 1000 + w), h, w)


def _png(chunks) -> bytes:
    """A PNG file of (type, payload) chunks, each with its length and a correct CRC."""
    return b"\x89PNG\r\n\x1a\n" + b"".join(struct.pack(">I", len(data)) + kind + data +
                                          struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
                                          for kind, data in chunks)


def _chunks(data: bytes) -> list:
    """A PNG file's (type, payload) chunks."""
    out, p = [], 8
    while p + 8 <= len(data):
        n, kind = struct.unpack(">I4s", data[p:p + 8])
        out.append((kind, data[p + 8:p + 8 + n]))
        p += 12 + n
    return out


def _png_with_size(path, width, height):
    """A valid PNG whose header declares width x height (a decompression bomb when large)."""
    ihdr = struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0)
    path.write_bytes(_png([(b"IHDR", ihdr), (b"IDAT", zlib.compress(b"\x00" * 64)), (b"IEND", b"")]))


def _png_parts(im):
    """(the chunks before the pixels, the pixels' whole compressed stream) of ``im`` saved as PNG."""
    b = io.BytesIO()
    im.save(b, format="PNG")
    chunks = _chunks(b.getvalue())
    return [c for c in chunks if c[0] not in (b"IDAT", b"IEND")], b"".join(d for k, d in chunks if k == b"IDAT")


def _exif(orientation: int) -> Image.Exif:
    exif = Image.Exif()
    exif[0x0112] = orientation
    return exif


def _jpeg_bad_exif() -> bytes:
    """A JPEG whose EXIF block (orientation 6) has a tag pointing past its end: Pillow warns, decodes it."""
    ifd = (struct.pack("<2sHIH", b"II", 42, 8, 2) + struct.pack("<HHII", 270, 2, 100, 9999)
           + struct.pack("<HHIHH", 0x0112, 3, 1, 6, 0) + struct.pack("<I", 0))
    b = io.BytesIO()
    scene(30, 50).save(b, format="JPEG", quality=95, exif=b"Exif\0\0" + ifd)
    return b.getvalue()


def _tiff_corrupt_deflate() -> bytes:
    """A deflate TIFF whose compressed strip is damaged: libtiff writes its error to stderr."""
    b = io.BytesIO()
    scene().save(b, format="TIFF", compression="tiff_deflate")
    data = bytearray(b.getvalue())
    for i in range(300, 900):
        data[i] ^= 0x5A
    return bytes(data)


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
    elif kind == "png_stream_truncated":  # the compressed pixel stream cut in half, every chunk well formed
        head, idat = _png_parts(scene())
        (d / "a.png").write_bytes(_png(head + [(b"IDAT", idat[: len(idat) // 2]), (b"IEND", b"")]))
    elif kind == "png_stream_corrupt":  # damaged compressed bytes, the chunk's CRC recomputed to match them
        head, idat = _png_parts(scene())
        bad = bytes(b ^ 0xA5 if len(idat) // 3 <= i < len(idat) // 3 + 40 else b for i, b in enumerate(idat))
        (d / "a.png").write_bytes(_png(head + [(b"IDAT", bad), (b"IEND", b"")]))
    elif kind == "png_last_chunk_cut":  # the file ends inside a text chunk after the pixels
        head, idat = _png_parts(scene())
        data = _png(head + [(b"IDAT", idat), (b"tEXt", b"Comment\0" + b"x" * 50), (b"IEND", b"")])
        (d / "a.png").write_bytes(data[:-32])
    elif kind == "png_late_exif_truncated":  # pixels cut, EXIF after them: probing the EXIF loads the pixels
        head, idat = _png_parts(scene(30, 50))
        (d / "a.png").write_bytes(_png(head + [(b"IDAT", idat[: len(idat) // 2]), (b"eXIf", _exif(6).tobytes()),
                                               (b"IEND", b"")]))
    elif kind == "png_late_exif":  # a whole PNG whose EXIF (orientation 6) comes after the pixels
        head, idat = _png_parts(scene(30, 50))
        (d / "a.png").write_bytes(_png(head + [(b"IDAT", idat), (b"eXIf", _exif(6).tobytes()), (b"IEND", b"")]))
    elif kind == "apng_without_fctl":  # the second frame's frame control chunk removed
        b = io.BytesIO()
        scene().save(b, format="PNG", save_all=True, append_images=[scene().transpose(Image.Transpose.ROTATE_180)])
        chunks = _chunks(b.getvalue())
        last = max(i for i, (k, _) in enumerate(chunks) if k == b"fcTL")
        (d / "a.png").write_bytes(_png(chunks[:last] + chunks[last + 1:]))
    elif kind == "tiff_corrupt_deflate":
        (d / "a.tif").write_bytes(_tiff_corrupt_deflate())
        return "a.tif"
    elif kind.startswith("tiff_orientation_"):
        scene(30, 50).save(d / "a.tif", exif=_exif(int(kind[-1])), compression="tiff_lzw")
        return "a.tif"
    elif kind in ("webp_orientation_6", "avif_orientation_6"):
        fmt = kind[:4]
        if not features.check(fmt):
            pytest.skip(f"this Pillow has no {fmt} support")
        # (torchvision's extensions, which ImageFolder takes, do not include .avif: dsc reads the content)
        name = "a.webp" if fmt == "webp" else "avif.png"
        scene(30, 50).save(d / name, format=fmt.upper(), exif=_exif(6), lossless=True, quality=100)
        return name
    elif kind == "jpeg_bad_exif":
        (d / "a.jpg").write_bytes(_jpeg_bad_exif())
    elif kind == "i16_transparency":  # 16-bit grey with a tRNS key: one block exactly the key
        a = np.arange(40 * 56, dtype=np.uint16).reshape(40, 56) * 29
        a[5:15, 5:20] = 4660
        Image.fromarray(a).save(d / "a.png", transparency=4660)
    elif kind == "l_transparency":
        a = np.asarray(scene().convert("L")).copy()
        a[5:15, 5:20] = 77
        Image.fromarray(a).save(d / "a.png", transparency=77)
    elif kind == "rgb_transparency":
        a = np.asarray(scene()).copy()
        a[5:15, 5:20] = (10, 200, 30)
        Image.fromarray(a).save(d / "a.png", transparency=(10, 200, 30))
    elif kind == "ycck_jpeg":  # a CMYK JPEG whose Adobe marker says its components are YCCK
        b = io.BytesIO()
        scene().convert("CMYK").save(b, format="JPEG")
        data = bytearray(b.getvalue())
        i = data.find(b"Adobe") - 4  # FF EE, length, "Adobe", version, flags0, flags1, transform
        end = i + 2 + struct.unpack(">H", data[i + 2:i + 4])[0]
        assert data[i:i + 2] == b"\xff\xee" and data[end - 1] == 0
        data[end - 1] = 2
        (d / "a.jpg").write_bytes(bytes(data))
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
    "zero_bytes": ("skip", "the file is empty (0 bytes)"),
    "truncated_jpeg": ("skip", "truncated"),
    "truncated_png": ("skip", "cannot decode image"),
    "png_stream_truncated": ("skip", "image file is truncated"),
    "png_stream_corrupt": ("skip", "unrecognized data stream contents"),
    "png_last_chunk_cut": ("skip", "Truncated File Read"),
    "png_late_exif_truncated": ("skip", "image file is truncated"),
    "apng_without_fctl": ("skip", "APNG contains frame sequence errors"),
    "tiff_corrupt_deflate": ("skip", "ZIPDecode: Decoding error"),  # libtiff's stderr line, in the reason
    "random_bytes": ("skip", "cannot identify image file"),
    "text_as_jpg": ("skip", "cannot identify image file"),
    "png_named_jpg": ("ok", None),
    "cmyk_jpeg": ("ok", None),
    "png_16bit": ("ok", None),
    "palette_transparency": ("ok", None),
    "la": ("ok", None),
    "bilevel": ("ok", None),
    **{f"exif_{k}": ("ok", None) for k in range(1, 9)},
    **{f"tiff_orientation_{k}": ("ok", None) for k in range(1, 9)},
    "png_late_exif": ("ok", None),
    "webp_orientation_6": ("ok", None),
    "avif_orientation_6": ("ok", None),
    "jpeg_bad_exif": ("ok", None),
    "ycck_jpeg": ("ok", None),
    "i16_transparency": ("ok", None),
    "l_transparency": ("ok", None),
    "rgb_transparency": ("ok", None),
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


@pytest.mark.filterwarnings("ignore:Tag data larger than file")  # (the reference's own decode of jpeg_bad_exif)
@pytest.mark.parametrize("size", [None, 64, (24, 32)], ids=["ragged", "64", "24x32"])
@pytest.mark.parametrize("kind", list(CASES))
def test_corpus_case(tmp_path, kind, size):
    """Each input compiled ragged and at a fixed size: pixels equal to PIL's full load under the documented
    rules (oriented as exif_transpose orients the fresh file), its size as shown recorded; or skipped,
    named, with the reason."""
    outcome, reason = CASES[kind]
    src = tmp_path / "src"
    d = src / "c"
    d.mkdir(parents=True)
    name = make(kind, d)
    scene().save(src / "c" / "zz_good.png")  # every case also holds a good image
    out = tmp_path / "out"
    report = dsc.compile_imagefolder(src, out, size=size, on_error="skip", progress=False, workers=1)
    ds = dsc.open(out)
    key = f"c/{name}"
    if outcome == "ok":
        assert key in ds.keys and not report.skipped
        i = ds.keys.index(key)
        want, _ = reference(src / key, size=None if size is None else (size, size) if isinstance(size, int) else size)
        np.testing.assert_array_equal(ds[i]["image"].numpy(), want)
        shown = ref_decode(src / key)
        assert ds.orig_sizes[i].tolist() == [shown.height, shown.width]
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
        assert "object at 0x" not in report.skipped[0]["reason"]  # (PIL's name for bytes in memory)
        with pytest.raises(dsc.SampleError) as e:  # the default policy stops, naming the file
            dsc.compile_imagefolder(src, tmp_path / "out2", size=size, progress=False, workers=1)
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


BROKEN = [k for k, (outcome, _) in CASES.items() if outcome == "skip" and k not in ("dangling_symlink", "float_tiff")]


@pytest.mark.parametrize("workers", [1, 2])
def test_broken_files_are_skipped_whatever_load_truncated_images_says(tmp_path, monkeypatch, workers):
    """The calling process set PIL's LOAD_TRUNCATED_IMAGES (it turns truncated files into half-black
    images): dsc still skips every broken file, in its own process and in forked workers, and leaves the
    setting as it found it."""
    monkeypatch.setattr(ImageFile, "LOAD_TRUNCATED_IMAGES", True)
    src = tmp_path / "src"
    names = {}
    for kind in BROKEN:
        (src / kind).mkdir(parents=True)
        names[kind] = make(kind, src / kind)
    (src / "good").mkdir()
    scene().save(src / "good" / "a.png")
    report = dsc.compile_imagefolder(src, tmp_path / "out", size=64, on_error="skip", progress=False,
                                     workers=workers, shard_size=4)
    assert ImageFile.LOAD_TRUNCATED_IMAGES is True
    assert dsc.open(tmp_path / "out").keys == ["good/a.png"]
    got = {s["key"]: s["reason"] for s in report.skipped}
    assert sorted(got) == sorted(f"{k}/{n}" for k, n in names.items())
    for kind in BROKEN:
        assert CASES[kind][1] in got[f"{kind}/{names[kind]}"], kind


def test_decoding_messages_name_their_file(tmp_path, capfd):
    """Pillow's warnings and libtiff's stderr lines, caught in the workers per file: a compiled file's are
    the report's warnings (and the CLI's warning lines), a skipped file's join its reason; none reaches the
    terminal unnamed."""
    from click.testing import CliRunner

    from dsc.cli import main

    src = tmp_path / "src" / "c"
    src.mkdir(parents=True)
    (src / "exif.jpg").write_bytes(_jpeg_bad_exif())
    (src / "strip.tif").write_bytes(_tiff_corrupt_deflate())
    for k in range(6):
        scene(30 + k, 40).save(src / f"ok{k}.png")
    report = dsc.compile_imagefolder(src.parent, tmp_path / "out", on_error="skip", progress=False, workers=2,
                                     shard_size=2)
    assert report.warnings == (f"{src / 'exif.jpg'}: UserWarning: Tag data larger than file. Skipping tag 270",)
    [skip] = report.skipped
    assert skip["key"] == "c/strip.tif" and "ZIPDecode: Decoding error" in skip["reason"]
    err = capfd.readouterr().err
    assert "ZIPDecode" not in err and "Tag data larger" not in err
    r = CliRunner().invoke(main, ["compile", "imagefolder", str(src.parent), str(tmp_path / "out2"), "-q",
                                  "--on-error", "skip"])
    assert r.exit_code == 0, r.output
    assert f"warning: {src / 'exif.jpg'}: UserWarning: Tag data larger than file" in r.output
    assert "c/strip.tif: cannot decode image: decoder error -2 (decoding also said: ZIPDecode" in r.output


def _tree(root) -> dict:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_two_compiles_of_the_same_input_are_byte_identical(tmp_path, monkeypatch):
    """With SOURCE_DATE_EPOCH set, every file of two compiles (different output folders, worker counts),
    _dsc/ included, is the same; the version record's creation time is that date. Without it, only that
    time may differ."""
    import json

    src = tmp_path / "src" / "c"
    src.mkdir(parents=True)
    for k in range(5):
        scene(30 + k, 40).save(src / f"ok{k}.png")
    scene(30, 50).save(src / "turned.tif", exif=_exif(6))
    (src / "empty.jpg").write_bytes(b"")
    (src / "noise.jpg").write_bytes(RNG.integers(0, 256, 500, dtype=np.uint8).tobytes())
    (src / "strip.tif").write_bytes(_tiff_corrupt_deflate())
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")
    trees = []
    for k, workers in enumerate((1, 2)):
        dsc.compile_imagefolder(src.parent, tmp_path / f"out{k}", on_error="skip", progress=False, workers=workers,
                                shard_size=2)
        trees.append(_tree(tmp_path / f"out{k}"))
    assert any(name.startswith("_dsc/log/") for name in trees[0])
    assert trees[0] == trees[1]
    assert json.loads(trees[0]["_dsc/log/0.json"])["created"] == "2023-11-14T22:13:20Z"
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "yesterday")
    with pytest.raises(dsc.ConfigError, match="SOURCE_DATE_EPOCH must be a whole number"):
        dsc.compile_imagefolder(src.parent, tmp_path / "out3", on_error="skip", progress=False)
    assert not (tmp_path / "out3").exists()
    monkeypatch.delenv("SOURCE_DATE_EPOCH")
    dsc.compile_imagefolder(src.parent, tmp_path / "out4", on_error="skip", progress=False, shard_size=2)
    tree = _tree(tmp_path / "out4")
    assert {n for n in tree if tree[n] != trees[0].get(n)} <= {"_dsc/log/0.json"}


def test_max_pixels_is_the_only_limit_for_tiffs_too(tmp_path, monkeypatch):
    """PIL's process-wide bomb limit is lifted for the whole decode: a TIFF, which PIL checks again as it
    loads, is not refused by it once --max-pixels admits it."""
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 100)
    src = tmp_path / "src" / "c"
    src.mkdir(parents=True)
    scene(30, 50).save(src / "a.tif", compression="tiff_lzw")
    scene(10, 10).save(src / "b.png")
    report = dsc.compile_imagefolder(src.parent, tmp_path / "out", progress=False, on_error="skip")
    assert not report.skipped and Image.MAX_IMAGE_PIXELS == 100
    report = dsc.compile_imagefolder(src.parent, tmp_path / "out2", progress=False, on_error="skip", max_pixels=1000)
    assert "50x30 = 1,500 pixels is more than the 1,000 allowed" in report.skipped[0]["reason"]
