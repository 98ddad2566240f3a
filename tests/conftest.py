from pathlib import Path

import numpy as np
import pytest
from PIL import Image, features

from dsc.synthetic import make_scene
# Object-storage servers on loopback (S3, GCS, Azure) and `object_store_url`, a test's URL on each of them.
from object_servers import azure_server, gcs_server, object_server, object_store_url, s3_server  # noqa: F401

# (relative path, kind) of every image the mixed ImageFolder holds, in torchvision order.
MIXED_IMAGES = [
    "cat/a_rgb.jpg", "cat/b_gray.jpg", "cat/c_exif6.jpg", "cat/d_exif3.jpg", "cat/e_tall.png", "cat/f_upper.JPG",
    "cat/sub/g_nested.png",
    "dog/a_rgba.png", "dog/b_palette_alpha.png", "dog/c_palette.png", "dog/d_gray16.png", "dog/e_bilevel.png",
    "dog/f_cmyk.jpg", "dog/g_la.png", "dog/h_tiny.bmp",
] + (["dog/i_big.webp"] if features.check("webp") else [])  # a PIL build without libwebp cannot write it


def _write_mixed(root: Path) -> None:
    rng = np.random.default_rng(1)
    scene = lambda h, w: make_scene(rng, h, w)  # noqa: E731
    (root / "cat" / "sub").mkdir(parents=True)
    (root / "dog").mkdir()
    (root / "empty").mkdir()
    (root / ".hidden").mkdir()
    scene(90, 120).save(root / "cat/a_rgb.jpg", quality=90)
    scene(150, 100).convert("L").save(root / "cat/b_gray.jpg")
    for name, orient in (("c_exif6.jpg", 6), ("d_exif3.jpg", 3)):
        exif = Image.Exif()
        exif[0x0112] = orient
        scene(70, 130).save(root / "cat" / name, exif=exif)
    scene(200, 64).save(root / "cat/e_tall.png")
    scene(80, 80).save(root / "cat/f_upper.JPG")
    scene(60, 90).save(root / "cat/sub/g_nested.png")
    rgba = scene(100, 100).convert("RGBA")
    a = np.asarray(rgba).copy()
    a[:, :50, 3] = 0
    a[:, 50:70, 3] = 128
    Image.fromarray(a, "RGBA").save(root / "dog/a_rgba.png")
    pal = scene(64, 96).convert("P", palette=Image.Palette.ADAPTIVE, colors=16)
    pal.save(root / "dog/b_palette_alpha.png", transparency=0)
    pal.save(root / "dog/c_palette.png")
    g16 = (np.linspace(0, 65535, 50 * 70).reshape(50, 70)).astype(np.uint16)
    Image.fromarray(g16).save(root / "dog/d_gray16.png")
    scene(40, 60).convert("1").save(root / "dog/e_bilevel.png")
    scene(77, 55).convert("CMYK").save(root / "dog/f_cmyk.jpg")
    scene(45, 45).convert("LA").save(root / "dog/g_la.png")
    scene(1, 1).save(root / "dog/h_tiny.bmp")
    if features.check("webp"):
        scene(300, 420).save(root / "dog/i_big.webp", quality=80)
    # Not samples: non-image files, hidden files, files in the root, a hidden class folder.
    (root / "dog/readme.md").write_text("not an image")
    scene(10, 10).save(root / "dog/.hidden.jpg")
    (root / "empty/notes.txt").write_text("no images here")
    scene(10, 10).save(root / ".hidden/x.jpg")
    scene(10, 10).save(root / "root_level.jpg")
    (root / "README.txt").write_text("root files are ignored")


@pytest.fixture(scope="session")
def mixed_src(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("mixed") / "src"
    root.mkdir()
    _write_mixed(root)
    return root


@pytest.fixture(scope="session")
def scenes_src(tmp_path_factory) -> Path:
    """A plain ImageFolder of 3 classes x 12 JPEG scenes."""
    from dsc.synthetic import write_imagefolder

    root = tmp_path_factory.mktemp("scenes") / "src"
    write_imagefolder(root, num_classes=3, per_class=12, size_range=(40, 120), seed=3)
    return root


def samples(ds) -> dict:
    """{key: (stored pixels, label)} of every sample of ``ds``: what two datasets must agree on."""
    b = ds.get_batch(range(len(ds)))
    return {k: (b["image"][i].numpy().tobytes(), int(b["label"][i])) for i, k in enumerate(ds.keys)}


def tree_bytes(root: Path) -> dict[str, bytes]:
    """Every file's bytes, but the version records (the time of the commit), the stat caches (times and inodes
    of the inputs) and the readers' pin files."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and not str(p.relative_to(root)).startswith(("_dsc/log/", "_dsc/stat/", "_dsc/pins/"))}


@pytest.fixture
def out(tmp_path) -> Path:
    return tmp_path / "out.dsc"


@pytest.fixture(scope="session")
def scenes_compiled(scenes_src, tmp_path_factory):
    """``scenes_compiled(**options)``: the scenes ImageFolder compiled with those options, once per session."""
    import dsc

    made = {}

    def compiled(**options):
        key = tuple(sorted(options.items()))
        if key not in made:
            out = tmp_path_factory.mktemp("scenes-compiled") / "out"
            dsc.compile_imagefolder(scenes_src, out, progress=False, **options)
            made[key] = out
        return dsc.open(made[key])
    return compiled


class DecodeCounter:
    """Counts decoder calls in every process (forked workers included) through an append-only file."""

    def __init__(self, monkeypatch, tmp_path):
        from dsc.compiler import units

        self.log = tmp_path / "decodes.log"
        self.log.write_text("")
        real, log = units.decode_image, str(self.log)

        def counting(obj, *a, **kw):
            with open(log, "a") as f:
                f.write(f"{getattr(obj, 'name', obj)}\n")
            return real(obj, *a, **kw)
        monkeypatch.setattr(units, "decode_image", counting)

    def reset(self):
        self.log.write_text("")

    @property
    def names(self) -> list[str]:
        return self.log.read_text().splitlines()


_STOP_AT_UNIT = """
import os, signal, sys
signal.signal(signal.SIGINT, signal.default_int_handler)  # (Ctrl-C as at a terminal, also where this test run was
# started with SIGINT ignored, e.g. in the background of a shell without job control: Python keeps it ignored)
from dsc.compiler import journal
from dsc.cli import main

real, done = journal.Journal.record, 0

def record(self, result, inputs):
    global done
    real(self, result, inputs)
    done += 1
    if done == {units}:
        os.killpg(0, {sig})  # Ctrl-C reaches the compile and its workers; kill -9 ends them all at once

journal.Journal.record = record
sys.argv = ["dsc", *{argv!r}]
main()
"""


def stopped_at_unit(argv, units: int, sig):
    """Run ``dsc *argv`` in a process group of its own and send the group ``sig`` (SIGINT: Ctrl-C;
    SIGKILL: kill -9) the moment the resume journal holds ``units`` finished units: a real signal at a
    known point, not a timing race. Returns the CompletedProcess (text output)."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.getcwd(), *sys.path])}
    code = _STOP_AT_UNIT.format(units=int(units), sig=int(sig), argv=[str(a) for a in argv])
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300,
                          start_new_session=True)


def journal_units(staging) -> set[int]:
    """The units a resume journal (``staging/.journal``) holds finished: their shard slots."""
    from dsc.compiler.journal import Journal

    return Journal.units_in(staging)


def tree_size(root) -> tuple[int, int]:
    """(files, bytes) under ``root``: every entry that is not a folder, the bytes of the regular files."""
    import os
    import stat

    files = nbytes = 0
    for dirpath, dirnames, filenames in os.walk(root):
        for name in filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]:
            st = os.lstat(os.path.join(dirpath, name))
            files += 1
            nbytes += st.st_size if stat.S_ISREG(st.st_mode) else 0
    return files, nbytes
