"""Sources as plugins: a package with an entry point in group ``dsc.sources`` (built here as a real wheel and
installed by pip) appears in ``dsc compile --help`` and compiles; ``dsc.register_source`` does the same
from Python; the registry refuses what would break the CLI."""
import base64
import hashlib
import os
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest
from click.testing import CliRunner

import dsc
from dsc.cli import main
from dsc.compiler.sources import Param, Record, ScannedSource, Source

PLUGIN = textwrap.dedent('''
    """A dsc source plugin: a text file of `path label` lines."""
    import os

    from dsc.compiler.sources import Param, Record, ScannedSource, Source


    class TextListSource(Source):
        """Images listed in a text file, one `path label` a line (paths relative to the file)."""

        name = "textlist"
        task = "classification"
        params = (Param("listing", "The text file.", type="file", required=True, argument=True),
                  Param("classes", "Class names.", type="csv", default=("a", "b", "c")))

        def scan(self):
            base = os.path.dirname(os.path.abspath(self.listing))
            records = []
            for line in open(self.listing, encoding="utf-8").read().splitlines():
                path, label = line.rsplit(" ", 1)
                records.append(Record(key=path, path=os.path.join(base, path), label=int(label)))
            return ScannedSource(kind="textlist", root=base, task="classification", records=records,
                                 classes=tuple(self.classes), summary={"kind": "textlist", "lines": len(records)})
''')


def _wheel(tmp_path) -> str:
    """dsc_plugin_demo-0.1-py3-none-any.whl with the entry point ``textlist``."""
    files = {
        "dsc_plugin_demo/__init__.py": PLUGIN,
        "dsc_plugin_demo-0.1.dist-info/METADATA": "Metadata-Version: 2.1\nName: dsc-plugin-demo\nVersion: 0.1\n",
        "dsc_plugin_demo-0.1.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: dsc-tests\nRoot-Is-Purelib: true\n"
                                               "Tag: py3-none-any\n",
        "dsc_plugin_demo-0.1.dist-info/entry_points.txt": "[dsc.sources]\ntextlist = dsc_plugin_demo:TextListSource\n",
    }
    record = []
    for name, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(text.encode())}")
    record.append("dsc_plugin_demo-0.1.dist-info/RECORD,,")
    files["dsc_plugin_demo-0.1.dist-info/RECORD"] = "\n".join(record) + "\n"
    path = tmp_path / "dsc_plugin_demo-0.1-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for name, text in files.items():
            z.writestr(name, text)
    return str(path)


def _listing(scenes_src, tmp_path):
    lines = [f"{p} {int(p.parent.name[-1])}" for p in sorted(scenes_src.rglob("*.jpg"))]  # absolute paths
    (tmp_path / "list.txt").write_text("\n".join(lines))
    return tmp_path / "list.txt", len(lines)


def test_an_installed_entry_point_source_is_a_cli_command(scenes_src, tmp_path):
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps", "--target",
                    str(site), _wheel(tmp_path)], check=True, capture_output=True)
    env = {**os.environ, "PYTHONPATH": str(site)}
    dsc_cli = [sys.executable, "-m", "dsc.cli"]
    r = subprocess.run(dsc_cli + ["compile", "--help"], env=env, capture_output=True, text=True)
    assert r.returncode == 0 and "textlist" in r.stdout and "Images listed in a text file" in r.stdout, r.stderr
    listing, n = _listing(scenes_src, tmp_path)
    r = subprocess.run(dsc_cli + ["compile", "textlist", str(listing), str(tmp_path / "out"), "--classes", "a,b,c",
                                  "--size", "16", "-q"], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    ds = dsc.open(tmp_path / "out")
    assert len(ds) == n and ds.classes == ["a", "b", "c"] and ds.manifest.source["kind"] == "textlist"
    r = subprocess.run([sys.executable, "-c", "import dsc, sys; r = dsc.compile_textlist(sys.argv[1], sys.argv[2], "
                        "classes=['a', 'b', 'c'], size=8, progress=False); print(r.manifest.num_samples)",
                        str(listing), str(tmp_path / "out2")], env=env, capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.strip() == str(n), r.stderr
    # without the plugin installed the command does not exist, and says which ones do
    r = subprocess.run(dsc_cli + ["compile", "textlist", "x", "y"], capture_output=True, text=True)
    assert r.returncode == 2 and "no source named 'textlist' (the sources are: imagefolder," in r.stderr


@pytest.fixture
def registry(monkeypatch):
    from dsc.compiler import sources

    monkeypatch.setattr(sources, "_registry", dict(sources._registry))
    return sources


def test_register_source_from_python(scenes_src, tmp_path, registry):
    @dsc.register_source
    class Flat(Source):
        """Every image file directly in one folder, label 0."""

        name = "flat"
        params = (Param("folder", "The folder.", type="dir", required=True, argument=True),)

        def scan(self):
            folder = Path(self.folder)
            files = sorted(folder.iterdir())
            return ScannedSource(kind="flat", root=str(folder), task="classification",
                                 records=[Record(key=p.name, path=str(p), label=0) for p in files], classes=("x",))

    folder = scenes_src / "class_00"
    r = dsc.compile_flat(folder, tmp_path / "a", size=8, progress=False)
    assert r.manifest.num_samples == len(list(folder.iterdir()))
    help_ = CliRunner().invoke(main, ["compile", "--help"]).output
    assert "flat" in help_ and "Every image file directly in one folder" in help_
    r = CliRunner().invoke(main, ["compile", "flat", str(folder), str(tmp_path / "b"), "--size", "8", "-q"])
    assert r.exit_code == 0, r.output
    with pytest.raises(dsc.ConfigError, match="unknown option colour; flat takes folder and the compile options"):
        dsc.compile_flat(folder, tmp_path / "c", colour=3)
    with pytest.raises(dsc.ConfigError, match="unknown option"):
        dsc.compile_flat(folder, tmp_path / "c", sise=8)
    with pytest.raises(dsc.ConfigError, match="unknown option explicit;") as e:  # internal: neither listed nor taken
        dsc.compile_flat(folder, tmp_path / "c", explicit=("size",))
    assert "explicit" not in str(e.value).split(";")[1]


def test_the_registry_refuses_what_would_break(registry):
    class Twice(Source):
        name = "imagefolder"

    with pytest.raises(dsc.ConfigError, match="already registered"):
        dsc.register_source(Twice)

    class Shadow(Source):
        name = "shadow"
        params = (Param("size", "clashes with --size"),)

    with pytest.raises(dsc.ConfigError, match="would shadow a compile option"):
        dsc.register_source(Shadow)

    class BadName(Source):
        name = "Bad-Name"

    with pytest.raises(dsc.ConfigError, match="lower-case identifier"):
        dsc.register_source(BadName)
    with pytest.raises(dsc.ConfigError, match="Source subclass"):
        dsc.register_source(object)
    assert isinstance(dsc.ConfigError("x"), ValueError) and isinstance(dsc.ConfigError("x"), dsc.DscError)


@pytest.mark.parametrize("call,match", [
    (lambda ds: dsc.Loader(ds, batch_size=2.5), "batch_size must be a positive int"),
    (lambda ds: dsc.Loader(ds, batch_size=2, order="shuffled"), "order must be one of"),
    (lambda ds: dsc.Loader(ds, batch_size=2, device="gpu9"), "is not a device"),
    (lambda ds: dsc.open(ds.path, boxes="ragged"), "boxes must be one of"),
    (lambda ds: ds.get_batch([0], images="tiled"), "images must be one of"),
    (lambda ds: dsc.CompileOptions(size=-3), "size must be"),
])
def test_bad_arguments_are_config_errors(scenes_src, tmp_path, call, match):
    dsc.compile_imagefolder(scenes_src, tmp_path / "ds", size=8, progress=False)
    with pytest.raises(dsc.ConfigError, match=match):
        call(dsc.open(tmp_path / "ds"))


def test_a_plugins_own_errors_are_one_line(scenes_src, tmp_path, registry):
    folder = scenes_src / "class_00"

    @dsc.register_source
    class Buggy(Source):
        """Raises from scan or from its fetcher."""

        name = "buggy"
        params = (Param("where", "scan or fetch", type="choice", choices=("scan", "fetch"), default="scan"),)

        def scan(self):
            if self.where == "scan":
                raise KeyError("oops")
            files = sorted(folder.iterdir())
            return ScannedSource(kind="buggy", root=str(folder), task="classification", classes=("x",),
                                 records=[Record(key=p.name, path=str(p), label=0) for p in files])

        def fetcher(self, records):
            def fetch(r):
                raise RuntimeError("cannot reach the bucket")
            return fetch

    r = CliRunner().invoke(main, ["compile", "buggy", str(tmp_path / "a"), "--size", "8", "-q"])
    assert r.exit_code == 1 and "Traceback" not in r.output
    assert "the 'buggy' source failed while scanning: KeyError: 'oops'" in r.output
    r = CliRunner().invoke(main, ["compile", "buggy", str(tmp_path / "b"), "--where", "fetch", "--size", "8", "-q"])
    assert r.exit_code == 1 and "the source could not fetch it (RuntimeError: cannot reach the bucket)" in r.output
    with pytest.raises(dsc.SourceError, match="none of the"):  # every sample skipped: nothing to publish
        dsc.compile_buggy(tmp_path / "c", where="fetch", size=8, on_error="skip", progress=False, workers=1)


def test_flags_and_names_that_would_clash_are_refused(registry):
    for params in ((Param("my_size", flag="--size"),), (Param("helpme", flag="-h"),), (Param("class"),),
                   (Param("a", flag="--x"), Param("b", flag="--x"))):
        cls = type("P", (Source,), {"name": "p", "params": params})
        with pytest.raises(dsc.ConfigError):
            dsc.register_source(cls)


def test_positional_calls_of_the_earlier_functions_still_work(tmp_path):
    """The signatures before the registry: compile_voc(root, out, split, classes, drop_empty_images),
    compile_coco(annotations, images, out, keep_category_ids, drop_empty_images), compile_yolo(root, out,
    split, data_yaml, classes_file, drop_empty_images)."""
    from dsc.synthetic import detection_scenes, write_coco, write_voc, write_yolo

    scenes = detection_scenes(5, seed=1)
    voc = write_voc(tmp_path / "voc", scenes)
    r = dsc.compile_voc(voc, tmp_path / "v", "trainval", None, True, size=16, progress=False)
    assert r.manifest.num_samples == sum(1 for s in scenes if s["boxes"])  # drop_empty_images, positionally
    ann, images = write_coco(tmp_path / "coco", scenes)
    r = dsc.compile_coco(ann, images, tmp_path / "c", True, False, size=16, progress=False)
    assert r.manifest.source["labels"] == "category_ids"
    yolo = write_yolo(tmp_path / "yolo", scenes)
    assert dsc.compile_yolo(yolo, tmp_path / "y", "train", None, None, True, size=16, progress=False)
    assert dsc.compile_coco is dsc.compile_coco  # one function, not rebuilt per access
