"""Issue 12's cases, each found trying to break dsc: a clear one-line error or a recorded skip, never a
traceback, a hang, a silently wrong or missing sample, or unbounded memory. Numbers refer to the issue."""
import errno
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

import dsc
from dsc.cli import main
from damage import edit_manifest, manifest_file, node_file, read_manifest, read_node, write_node

ENV = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}


def cli(*args):
    r = CliRunner().invoke(main, [str(a) for a in args])
    assert "Traceback" not in r.output, r.output
    assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)
    return r


def reseal(out: Path, edit) -> None:
    """Edit a dataset's manifest with ``edit(dict)`` and recompute its checksum, as a careless tool would."""
    edit_manifest(out, edit)


def peak_rss_mb(args) -> float:
    """Peak RSS (MB) of a `dsc` CLI run in a fresh process (one worker: the decode happens in it)."""
    # VmHWM, not ru_maxrss: ru_maxrss survives exec, so it would report the forking test process's peak
    code = ("import re, sys; from dsc.cli import main\ntry: main(sys.argv[1:])\nexcept SystemExit: pass\n"
            "print('RSS', re.search(r'VmHWM:\\s+(\\d+)', open('/proc/self/status').read())[1])")
    r = subprocess.run([sys.executable, "-c", code, *map(str, args)], env=ENV, capture_output=True, text=True,
                       timeout=300)
    assert "Traceback" not in r.stderr, r.stderr
    return int(r.stdout.split("RSS")[-1]) / 1024


@pytest.fixture
def src(scenes_src, tmp_path):
    s = tmp_path / "src"
    shutil.copytree(scenes_src, s)
    return s


# ----------------------------------------------------------------------------- 1. memory
@pytest.mark.parametrize("resizer,bound", [("pil", 250), ("torch", 500)])
def test_1_a_tiny_wide_image_needs_no_huge_intermediate(tmp_path, resizer, bound):
    (tmp_path / "src/a").mkdir(parents=True)
    rng = np.random.default_rng(0)
    Image.fromarray(rng.integers(0, 256, (1, 4000, 3), dtype=np.uint8)).save(tmp_path / "src/a/wide.png")
    rss = peak_rss_mb(["compile", "imagefolder", tmp_path / "src", tmp_path / "out", "--size", "224", "--resizer",
                       resizer, "--workers", "1", "-q"])
    assert rss < bound  # 1d5db43: ~2 GB (the whole 224 x 896,000 resize before the crop)
    ds = dsc.open(tmp_path / "out")
    assert ds[0]["image"].shape == (224, 224, 3)


def test_1_16_bit_images_and_max_pixels(tmp_path):
    (tmp_path / "src/a").mkdir(parents=True)
    g16 = (np.arange(3000 * 4000, dtype=np.uint32).reshape(3000, 4000) % 65536).astype(np.uint16)
    Image.fromarray(g16).save(tmp_path / "src/a/g16.png")
    rss = peak_rss_mb(["compile", "imagefolder", tmp_path / "src", tmp_path / "out", "--size", "64", "--workers",
                       "1", "-q"])
    assert rss < 220  # 1d5db43 widened the 12 M pixels to int64 twice: about 190 MB more
    np.testing.assert_array_equal(dsc.open(tmp_path / "out")[0]["image"].shape, (64, 64, 3))
    r = cli("compile", "imagefolder", tmp_path / "src", tmp_path / "o2", "--size", "64", "--max-pixels", "1000000",
            "-q")
    assert r.exit_code == 1 and "4000x3000 = 12,000,000 pixels is more than the 1,000,000 allowed" in r.output


# ----------------------------------------------------------------------------- 2-5. what a scan must not miss
def test_2_an_unreadable_folder_is_an_error_or_a_recorded_skip(src, tmp_path, monkeypatch):
    real = os.scandir
    blocked = str(src / "class_01")

    def scandir(path="."):
        if os.fspath(path) == blocked:
            raise PermissionError(errno.EACCES, "Permission denied", blocked)
        return real(path)
    monkeypatch.setattr(os, "scandir", scandir)
    with pytest.raises(dsc.SampleError, match="cannot list this folder"):
        dsc.compile_imagefolder(src, tmp_path / "a", size=8, progress=False, workers=1)
    r = dsc.compile_imagefolder(src, tmp_path / "b", size=8, progress=False, workers=1, on_error="skip")
    assert [s["key"] for s in r.skipped] == ["class_01"] and "Permission denied" in r.skipped[0]["reason"]


def test_3_a_fifo_never_blocks_the_compile(src, tmp_path):
    os.mkfifo(src / "class_00" / "z.png")
    for mode, code in (("skip", 0), ("fail", 1)):
        r = subprocess.run([sys.executable, "-m", "dsc.cli", "compile", "imagefolder", src, tmp_path / mode,
                            "--size", "8", "--on-error", mode, "-q"], env=ENV, capture_output=True, text=True,
                           timeout=120)
        assert r.returncode == code and "Traceback" not in r.stderr
        assert "not a regular file" in (r.stderr if mode == "fail" else dsc.open(tmp_path / mode).manifest.skipped[0]["reason"])
    # a FIFO a COCO file names is refused by the decoder, never opened
    from dsc.synthetic import detection_scenes, write_coco

    ann, images = write_coco(tmp_path / "coco", detection_scenes(3, seed=1))
    first = json.loads(ann.read_text())["images"][0]["file_name"]
    (images / first).unlink()
    os.mkfifo(images / first)
    r = dsc.compile_coco(ann, images, tmp_path / "c", size=8, on_error="skip", progress=False, workers=1)
    assert len(r.skipped) == 1 and "not a regular file" in r.skipped[0]["reason"]


def test_4_a_name_that_is_not_utf8_is_named_and_skipped(src, tmp_path):
    bad = os.path.join(os.fsencode(src / "class_00"), b"caf\xe9.png")
    shutil.copy(next((src / "class_00").glob("*.jpg")), bad)
    r = cli("compile", "imagefolder", src, tmp_path / "out", "--size", "8", "--on-error", "skip", "-q")
    assert r.exit_code == 0 and "caf\\xe9.png" in r.output and "not valid UTF-8" in r.output
    r = cli("compile", "imagefolder", src, tmp_path / "out2", "--size", "8", "-q")
    assert r.exit_code == 1 and "caf\\xe9.png" in r.output


def test_4_nul_bytes_and_lone_surrogates_in_annotations_are_named(tmp_path):
    """A COCO file_name with a NUL or a lone surrogate is a recorded skip (the key could not be stored); a
    class name like that is a one-line error; a non-UTF-8 source root compiles (only keys are stored)."""
    from dsc.synthetic import detection_scenes, seg_scenes, write_coco, write_segfolder

    ann, images = write_coco(tmp_path / "coco", detection_scenes(4, seed=1))
    data = json.loads(ann.read_text())
    data["images"][0]["file_name"] = "a\u0000.png"
    data["images"][1]["file_name"] = "caf\udce9.png"
    ann.write_text(json.dumps(data))  # ensure_ascii: the JSON holds \\u0000 and \\udce9 escapes
    r = cli("compile", "coco", "--annotations", ann, "--images", images, tmp_path / "o1", "--size", "8", "--on-error", "skip", "-q")
    assert r.exit_code == 0, r.output
    reasons = {s["key"]: s["reason"] for s in dsc.open(tmp_path / "o1").manifest.skipped}
    assert "NUL" in reasons["a\\x00.png"] and "not valid UTF-8" in reasons["caf\\xe9.png"]
    assert len(dsc.open(tmp_path / "o1")) == 2
    r = cli("compile", "coco", "--annotations", ann, "--images", images, tmp_path / "o2", "--size", "8", "-q")
    assert r.exit_code == 1 and "NUL" in r.output
    data["images"] = data["images"][2:]
    data["annotations"] = [a for a in data["annotations"] if a["image_id"] in {i["id"] for i in data["images"]}]
    data["categories"][0]["name"] = "c\ud800t"
    ann.write_text(json.dumps(data))
    r = cli("compile", "coco", "--annotations", ann, "--images", images, tmp_path / "o3", "--size", "8", "-q")
    assert r.exit_code == 1 and "class name 'c\\ud800t' is not valid UTF-8" in r.output
    r = cli("compile", "segfolder", write_segfolder(tmp_path / "seg", seg_scenes(2)), tmp_path / "o4",
            "--classes", "bg,caf\udce9,a,b,c", "-q")
    assert r.exit_code == 1 and "class name 'caf\\xe9' is not valid UTF-8" in r.output, r.output
    root = Path(os.fsdecode(os.fsencode(tmp_path) + b"/r\xe9"))
    (root / "a").mkdir(parents=True)
    Image.new("RGB", (8, 8)).save(root / "a" / "x.png")
    r = cli("compile", "imagefolder", root, tmp_path / "o5", "-q")
    assert r.exit_code == 0, r.output
    assert dsc.open(tmp_path / "o5").keys == ["a/x.png"]


def test_5_an_output_inside_the_source_is_never_an_input(src, tmp_path):
    first = dsc.compile_imagefolder(src, src / "all.dsc", size=8, progress=False)
    again = dsc.compile_imagefolder(src, src / "all.dsc", size=8, progress=False, overwrite=True)
    assert again.manifest.classes == first.manifest.classes == ("class_00", "class_01", "class_02")
    assert again.manifest.num_samples == first.manifest.num_samples


# ----------------------------------------------------------------------------- 6-7. resume
def test_6_resume_recompiles_a_shard_whose_input_changed(src, tmp_path):
    from dsc.synthetic import make_scene

    out = tmp_path / "out"
    broken = src / "class_02" / "zz_broken.jpg"
    broken.write_bytes(b"not a jpeg")
    with pytest.raises(dsc.SampleError):  # the last shard fails; the first ones are journaled
        dsc.compile_imagefolder(src, out, size=16, shard_size=4, workers=1, progress=False)
    edited = sorted((src / "class_00").glob("*.jpg"))[1]  # in shard 0, already finished
    make_scene(np.random.default_rng(99), 50, 60).save(edited)
    every = [p for c in sorted(src.iterdir()) for p in sorted(c.iterdir())]
    sneaky = every[5]  # in shard 1, finished, alone changed there: same size, mtime set back, only the ctime shows it
    assert sneaky.suffix == ".jpg" and every.index(edited) < 4
    st, buf = sneaky.stat(), __import__("io").BytesIO()
    Image.new("RGB", (16, 16), (200, 200, 200)).save(buf, "JPEG")
    assert len(buf.getvalue()) < st.st_size
    sneaky.write_bytes(buf.getvalue().ljust(st.st_size, b"\0"))  # bytes after the JPEG's end are ignored
    os.utime(sneaky, ns=(st.st_atime_ns, st.st_mtime_ns))
    broken.unlink()
    shutil.copy(edited, broken)  # the failing input fixed
    dsc.compile_imagefolder(src, out, size=16, shard_size=4, workers=1, progress=False, resume=True)
    dsc.compile_imagefolder(src, tmp_path / "fresh", size=16, shard_size=4, workers=1, progress=False)
    a, b = dsc.open(out), dsc.open(tmp_path / "fresh")
    assert all(np.array_equal(a[i]["image"], b[i]["image"]) for i in range(len(a)))  # no stale pixels
    assert dsc.verify(out).ok


def test_7_resume_never_adopts_what_is_not_a_partial_compile(src, tmp_path):
    out = tmp_path / "out"
    dsc.compile_imagefolder(src, tmp_path / "old", max_side=20, progress=False)  # a ragged dataset
    shutil.copytree(tmp_path / "old", tmp_path / ".out.dsc-tmp")  # as a kill after the overwrite swap leaves it
    dsc.compile_imagefolder(src, out, size=16, progress=False)
    warnings = []
    from dsc.compiler import compile_source, options_from
    from dsc.compiler.sources import get_source

    shutil.copytree(tmp_path / "old", tmp_path / ".out.dsc-tmp", dirs_exist_ok=True)
    compile_source(get_source("imagefolder")(src=src), out, options_from(
        "imagefolder", dict(size=16, overwrite=True, resume=True, progress=False)), warn=warnings.append)
    assert any("no resumable compile" in w for w in warnings)
    assert not (out / "image" / "values").exists() and dsc.verify(out).ok  # no ragged leftovers


# ----------------------------------------------------------------------------- 8. one-line errors
def test_8_source_files_that_used_to_give_tracebacks(tmp_path):
    from dsc.synthetic import detection_scenes, write_coco, write_voc, write_yolo

    scenes = detection_scenes(3, seed=2)
    ann, images = write_coco(tmp_path / "coco", scenes)
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100000 + "]" * 100000)
    r = cli("compile", "coco", "--annotations", deep, "--images", images, tmp_path / "o1", "-q")
    assert r.exit_code == 1 and "nested too deeply" in r.output
    voc = write_voc(tmp_path / "voc", scenes)
    xml = voc / "Annotations" / f"{Path(scenes[0]['file']).stem}.xml"
    xml.write_text(xml.read_text().replace(f"<width>{scenes[0]['width']}</width>", "<width>nan</width>"), "utf-8")
    r = cli("compile", "voc", voc, tmp_path / "o2", "-q")
    assert r.exit_code == 1 and "not a finite number" in r.output
    (voc / "ImageSets/Main/trainval.txt").write_bytes(b"scene_\xff\n")
    r = cli("compile", "voc", voc, tmp_path / "o3", "-q")
    assert r.exit_code == 1 and "not UTF-8" in r.output
    yolo = write_yolo(tmp_path / "yolo", scenes)
    next((yolo / "labels/train").glob("*.txt")).write_bytes(b"0 0.5 0.5 0.1 \xff\n")
    r = cli("compile", "yolo", yolo, tmp_path / "o4", "-q")
    assert r.exit_code == 1 and "label file is not UTF-8" in r.output
    (yolo / "data.yaml").write_text("path: 5\ntrain: images/train\nnames: [a]\n")
    r = cli("compile", "yolo", yolo, tmp_path / "o5", "-q")
    assert r.exit_code == 1 and "'path' must be a folder" in r.output
    (yolo / "data.yaml").write_bytes(b"names: [\xff]\n")
    r = cli("compile", "yolo", yolo, tmp_path / "o6", "-q")
    assert r.exit_code == 1 and "data.yaml is not UTF-8" in r.output


@pytest.fixture(scope="module")
def datasets(tmp_path_factory, scenes_src):
    """A fixed, a ragged, a detection and a segmentation dataset to damage (copied per test)."""
    from dsc.synthetic import detection_scenes, seg_scenes, write_coco, write_segfolder

    root = tmp_path_factory.mktemp("hard")
    dsc.compile_imagefolder(scenes_src, root / "fixed", size=12, shard_size=8, progress=False)
    dsc.compile_imagefolder(scenes_src, root / "ragged", max_side=30, shard_size=8, progress=False)
    ann, images = write_coco(root / "coco", detection_scenes(6, seed=5))
    dsc.compile_coco(ann, images, root / "det", max_side=40, progress=False)
    dsc.compile_segfolder(write_segfolder(root / "segsrc", seg_scenes(4)), root / "seg", size=16, progress=False)
    return root


def copy(datasets, name, tmp_path) -> Path:
    out = tmp_path / name
    shutil.copytree(datasets / name, out)
    return out


@pytest.mark.parametrize("name,edit,match,seal", [
    ("fixed", lambda m: m.__setitem__("source", "ab"), "source has the wrong type", True),
    ("det", lambda m: m.__setitem__("category_ids", ["x"]), "category_ids", True),
    ("fixed", lambda m: m["files"].__setitem__(next(iter(m["files"])), 5), "files", True),
    # a wrong fixed height (format 4: the shard table's entries are checked as read, the array's zarr.json at open)
    ("fixed", lambda m: m["image"].__setitem__("height", 13), "image shard 0|does not describe", True),
    ("fixed", lambda m: m.update(num_samples=10 ** 12, rows=10 ** 12), "shards listed|shard table of", True),  # 17
    ("fixed", lambda m: m.pop("checksum"), "checksum", False),  # 16: the checksum is mandatory
    ("seg", lambda m: m["fields"].__setitem__("index", m["fields"].pop("mask")), "field name 'index'", True),
    ("seg", lambda m: m["fields"].__setitem__("mask_sizes", m["fields"].pop("mask")), "batches already use", True),
    ("det", lambda m: m["objects"]["attributes"].__setitem__("boxes", m["objects"]["attributes"].pop("area")),
     "box attribute 'boxes'", True),
], ids=["source", "category_ids", "files", "height", "num_samples", "no-checksum", "field-index", "field-suffix",
        "attribute-boxes"])
def test_8_16_17_manifest_edits_are_refused_at_open(datasets, tmp_path, name, edit, match, seal):
    out = copy(datasets, name, tmp_path)
    edit_manifest(out, edit, sealed=seal)
    with pytest.raises(dsc.CorruptDatasetError, match=match):
        dsc.open(out)
    try:
        report = dsc.verify(out)
    except dsc.CorruptDatasetError:
        pass
    else:  # (a manifest that parses, whose shard table's entries or arrays disagree: reported, not raised)
        assert not report.ok


def _json_bytes(meta) -> bytes:
    return (json.dumps(meta, indent=2) + "\n").encode()


def test_8_16_node_metadata_and_arrays_that_used_to_give_tracebacks(datasets, tmp_path):
    out = copy(datasets, "fixed", tmp_path)
    meta = json.loads(read_node(out, "label/zarr.json"))
    del meta["chunk_grid"]
    write_node(out, "label/zarr.json", _json_bytes(meta))
    with pytest.raises(dsc.CorruptDatasetError, match="label/zarr.json has 396 bytes, the manifest records 513"):
        dsc.open(out)
    write_node(out, "label/zarr.json", _json_bytes(meta), record=True)
    with pytest.raises(dsc.CorruptDatasetError, match="chunk grid"):
        dsc.open(out)
    out = copy(datasets, "fixed", tmp_path / "b")
    meta = json.loads(read_node(out, "image/zarr.json"))
    meta["shape"][1] = 13  # the image array's own metadata disagrees with the manifest
    write_node(out, "image/zarr.json", _json_bytes(meta), record=True)
    with pytest.raises(dsc.CorruptDatasetError, match="image/zarr.json does not describe"):
        dsc.open(out)
    assert not dsc.verify(out).ok
    out = copy(datasets, "ragged", tmp_path / "c")
    data = bytearray(read_node(out, "image/shapes/c/0/0"))
    data[0] ^= 0x01  # one damaged value in the ragged shapes file
    write_node(out, "image/shapes/c/0/0", bytes(data), record=True)
    with pytest.raises(dsc.CorruptDatasetError, match="shapes disagrees"):
        dsc.open(out)
    edit_manifest(out, None, raw="[" * 100000 + "]" * 100000)  # nested JSON where the manifest is
    with pytest.raises(dsc.CorruptDatasetError, match="nested too deeply"):
        dsc.open(out)


# ----------------------------------------------------------------------------- 8. the fuzz test
def _mutations(rng, value):
    choices = [None, -1, 0, 1, 2 ** 62, 10 ** 12, 1.5, float("inf"), "", "x", "../x", [], [1], {}, {"a": 1}, True]
    return choices[int(rng.integers(len(choices)))]


def _paths(obj, prefix=()):
    yield prefix
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(obj, list):
        for k, v in enumerate(obj[:4]):
            yield from _paths(v, prefix + (k,))


def _edit(obj, path, rng):
    *head, last = path
    for k in head:
        obj = obj[k]
    r = rng.random()
    if r < 0.2 and isinstance(obj, dict):
        del obj[last]
    elif r < 0.3 and isinstance(obj, dict):
        obj["surprise"] = 1
    else:
        obj[last] = _mutations(rng, obj[last])


def test_8_fuzzing_the_manifest_and_node_metadata_gives_only_dsc_errors(datasets, tmp_path):
    """Random edits of types, numbers and keys, checksum resealed or not: opening, reading and verifying
    give a DscError or work, never another exception (and never a hang: each case is small)."""
    import torch

    rng = np.random.default_rng(0)
    outcomes = {"refused": 0, "read": 0}
    for case in range(300):
        name = ("fixed", "ragged", "det")[case % 3]
        out = tmp_path / f"c{case}"
        shutil.copytree(datasets / name, out)
        pick = rng.random()
        if pick < 0.6:  # the manifest (in the version record), checksum resealed or not
            def edit(m):
                paths = [p for p in _paths(m) if p]
                _edit(m, paths[int(rng.integers(len(paths)))], rng)
            edit_manifest(out, edit, sealed=rng.random() < 0.7)
        elif pick < 0.7:  # the version record around it
            record = manifest_file(out)
            d = json.loads(record.read_text())
            d.pop("manifest")
            paths = [p for p in _paths(d) if p]
            _edit(d, paths[int(rng.integers(len(paths)))], rng)
            d["manifest"] = json.loads(record.read_text())["manifest"]
            record.write_text(json.dumps(d))
        else:  # a node's metadata, its new size and hash recorded or not
            nodes = sorted(rel for rel in read_manifest(out)["files"] if rel.endswith("zarr.json"))
            rel = nodes[int(rng.integers(len(nodes)))]
            meta = json.loads(read_node(out, rel))
            paths = [p for p in _paths(meta) if p]
            _edit(meta, paths[int(rng.integers(len(paths)))], rng)
            write_node(out, rel, json.dumps(meta).encode(), record=rng.random() < 0.7)
        try:
            ds = dsc.open(out)
            ds[0], ds[len(ds) - 1]
            ds.get_batch([0, len(ds) - 1])
            next(iter(dsc.Loader(ds, batch_size=2)))
            ds.keys[0], ds.affine[0]
            dsc.verify(out)
            outcomes["read"] += 1
        except dsc.DscError:
            outcomes["refused"] += 1
        except (torch.cuda.OutOfMemoryError,) as e:  # pragma: no cover
            raise AssertionError(e)
        shutil.rmtree(out)
    assert outcomes["refused"] >= 30 and outcomes["read"] >= 30, outcomes  # both outcomes exercised


# ----------------------------------------------------------------------------- 9-11. small inputs, big outputs
def test_9_small_inputs_do_not_expand(tmp_path, scenes_src):
    from dsc.synthetic import detection_scenes, write_coco, write_yolo

    ann, images = write_coco(tmp_path / "coco", detection_scenes(3, seed=1))
    data = json.loads(ann.read_text())
    data["categories"][0]["id"] = 2_000_000
    for a in data["annotations"]:
        a["category_id"] = 2_000_000
    ann.write_text(json.dumps(data))
    r = cli("compile", "coco", "--annotations", ann, "--images", images, tmp_path / "o", "--keep-category-ids", "-q")
    assert r.exit_code == 1 and "above 65,535" in r.output
    yolo = write_yolo(tmp_path / "yolo", detection_scenes(3, seed=1))
    (yolo / "data.yaml").write_text("a: &a [x, x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a]\n"
                                    "c: &c [*b, *b, *b, *b, *b, *b, *b, *b]\nd: &d [*c, *c, *c, *c, *c, *c, *c, *c]\n"
                                    "names: [*d, *d, *d, *d, *d, *d, *d, *d, *d, *d, *d, *d, *d, *d, *d, *d, *d, *d, "
                                    "*d, *d, *d, *d, *d, *d, *d, *d, *d]\ntrain: images/train\n")
    r = cli("compile", "yolo", yolo, tmp_path / "y", "-q")
    assert r.exit_code == 1 and "short name" in r.output
    small = tmp_path / "small"
    shutil.copytree(scenes_src / "class_00", small / "a")
    r = cli("compile", "imagefolder", small, tmp_path / "s", "--size", "8", "--shard-size", "10000000", "-q")
    assert r.exit_code == 0
    shard = tmp_path / "s/image/c/0/0/0/0"
    assert shard.stat().st_size < 1 << 20  # 1d5db43: 160 MB (an index of 10 M entries)
    with open(shard, "r+b") as f:  # verify checks a shard's size before reading it
        f.truncate(8 << 30)
    report = dsc.verify(tmp_path / "s")
    assert not report.ok and "bytes, the manifest says" in str(report.problems[0])


def test_10_xml_entities_are_refused(tmp_path):
    from dsc.synthetic import detection_scenes, write_voc

    voc = write_voc(tmp_path / "voc", detection_scenes(2, seed=1))
    xml = next((voc / "Annotations").glob("*.xml"))
    xml.write_text('<?xml version="1.0"?><!DOCTYPE lolz [<!ENTITY lol "lol"><!ENTITY lol2 "&lol;&lol;&lol;">]>'
                   + xml.read_text())
    r = cli("compile", "voc", voc, tmp_path / "o", "-q")
    assert r.exit_code == 1 and "refuses to expand" in r.output
    body = xml.read_text().split("]>", 1)[1]  # the same DTD in UTF-16, which a byte search does not see
    xml.write_bytes(('<?xml version="1.0" encoding="UTF-16"?><!DOCTYPE lolz [<!ENTITY lol "lol">]>' + body)
                    .encode("utf-16"))
    r = cli("compile", "voc", voc, tmp_path / "o", "-q")
    assert r.exit_code == 1 and "refuses to expand" in r.output


def test_11_file_names_outside_the_images_folder(tmp_path):
    from dsc.synthetic import detection_scenes, write_coco, write_voc

    scenes = detection_scenes(2, seed=1)
    ann, images = write_coco(tmp_path / "coco", scenes)
    shutil.copy(images / scenes[0]["file"], images.parent / "outside.png")
    data = json.loads(ann.read_text())
    data["images"][0]["file_name"] = "../outside.png"
    ann.write_text(json.dumps(data))
    r = cli("compile", "coco", "--annotations", ann, "--images", images, tmp_path / "o", "-q")
    assert r.exit_code == 1 and "points outside" in r.output and "--allow-outside-images" in r.output
    r = cli("compile", "coco", "--annotations", ann, "--images", images, tmp_path / "o", "--allow-outside-images",
            "-q")
    assert r.exit_code == 0
    voc = write_voc(tmp_path / "voc", scenes)
    xml = voc / "Annotations" / f"{Path(scenes[0]['file']).stem}.xml"
    xml.write_text(xml.read_text().replace(f"<filename>{scenes[0]['file']}</filename>",
                                           f"<filename>{images.parent / 'outside.png'}</filename>"))
    r = cli("compile", "voc", voc, tmp_path / "v", "-q")
    assert r.exit_code == 1 and "points outside" in r.output
    seg = write_voc(tmp_path / "seg", scenes)  # a split id is a plain name: it never reaches another folder
    (seg / "ImageSets/Main/trainval.txt").write_text("../../outside\n")
    r = cli("compile", "voc", seg, tmp_path / "s", "-q")
    assert r.exit_code == 1 and "'../../outside' is not an image id" in r.output


def test_3_9_annotation_files_that_are_there_but_not_files(tmp_path):
    """A label file, data.yaml, classes file or VOC XML that is a FIFO, a folder or a dangling link is named
    as such: never read as 'missing' (a YOLO image silently kept as a negative)."""
    from dsc.synthetic import detection_scenes, write_voc, write_yolo

    scenes = detection_scenes(3, seed=1)
    yolo = write_yolo(tmp_path / "yolo", scenes)
    label = sorted((yolo / "labels/train").glob("*.txt"))[0]
    label.unlink()
    os.mkfifo(label)
    r = dsc.compile_yolo(yolo, tmp_path / "y1", on_error="skip", progress=False, workers=1)
    assert len(r.skipped) == 1 and "the label file is not a regular file" in r.skipped[0]["reason"]
    label.unlink()
    label.symlink_to(tmp_path / "nowhere.txt")
    r = cli("compile", "yolo", yolo, tmp_path / "y2", "-q")
    assert r.exit_code == 1 and "the label file is a link to a missing file" in r.output
    label.unlink()
    (yolo / "data.yaml").rename(tmp_path / "data.yaml")
    os.mkfifo(yolo / "data.yaml")
    r = cli("compile", "yolo", yolo, tmp_path / "y3", "-q")
    assert r.exit_code == 1 and "the data.yaml is not a regular file" in r.output
    r = cli("compile", "yolo", yolo, tmp_path / "y4", "--data", yolo / "data.yaml", "-q")
    assert r.exit_code == 1 and "the data.yaml is not a regular file" in r.output
    voc = write_voc(tmp_path / "voc", scenes)
    xml = sorted((voc / "Annotations").glob("*.xml"))[0]
    xml.unlink()
    os.mkfifo(xml)
    r = cli("compile", "voc", voc, tmp_path / "v", "-q")
    assert r.exit_code == 1 and "the annotation file is not a regular file" in r.output


# ----------------------------------------------------------------------------- 12. messages
def test_12_messages(tmp_path, monkeypatch, scenes_src):
    from dsc.errors import WriteError
    from dsc.synthetic import write_coco

    scene = {"file": "one.png", "width": 40, "height": 30, "boxes": [[2, 2, 20, 20]], "labels": [0], "colors":
             [(200, 0, 0)], "orientation": 1, "iscrowd": [0], "raw_frame": False}
    ann, images = write_coco(tmp_path / "coco", [scene])
    r = cli("compile", "coco", "--annotations", ann, "--images", images, tmp_path / "o", "-q")
    assert "objects: 1 box (" in r.output  # 1d5db43: "1 bo"
    mount = WriteError.writing("OUT", OSError(errno.EXDEV, "Invalid cross-device link"))
    assert "mount point" in str(mount) and "free space" not in str(mount)
    full = WriteError.writing("x", OSError(errno.ENOSPC, "No space left on device"))
    assert "free space" in str(full) and "--resume" in str(full)
    import dsc.compiler.journal as J

    def no_space(path, obj, *base):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))
    monkeypatch.setattr(J, "write_json", no_space)
    r = cli("compile", "imagefolder", scenes_src, tmp_path / "j", "--size", "8", "-q")
    assert r.exit_code == 1 and "plan.json failed: No space left on device" in r.output and "free space" in r.output


# ----------------------------------------------------------------------------- 14-15. open handles
def test_14_an_open_dataset_never_mixes_two_compiles(scenes_src, tmp_path):
    out = tmp_path / "out"
    dsc.compile_imagefolder(scenes_src, out, size=12, shard_size=4, progress=False)
    ds = dsc.open(out)
    first = ds[0]["image"].clone()  # shard 0 mapped
    dsc.compile_imagefolder(scenes_src, out, size=12, shard_size=4, resize="stretch", progress=False,
                            overwrite=True)  # other pixels, swapped in while ds is open
    assert np.array_equal(ds[0]["image"], first)  # mapped: still the old compile's
    with pytest.raises(dsc.CorruptDatasetError, match="deleted or replaced since it was opened"):
        ds[20]  # not mapped yet: its file is gone with the old compile, never the new one's
    with pytest.raises(dsc.CorruptDatasetError, match="deleted or replaced"):
        ds.affine
    import torch.utils.data as tud  # a spawned worker re-opens the path: the parent sees why it cannot read
    loader = tud.DataLoader(ds, batch_size=4, num_workers=1, multiprocessing_context="spawn")
    with pytest.raises(Exception, match="was replaced by another compile since the dataset was opened"):
        next(iter(loader))


def test_15_links_inside_a_dataset_are_refused(datasets, tmp_path):
    out = copy(datasets, "fixed", tmp_path)
    shard = out / "image/c/1/0/0/0"
    (tmp_path / "elsewhere").write_bytes(shard.read_bytes())
    shard.unlink()
    shard.symlink_to(tmp_path / "elsewhere")
    with pytest.raises(dsc.UnsafePathError, match="symbolic link"):  # (format 4: each shard at its first read)
        dsc.open(out).get_batch(range(len(dsc.open(out))))
    report = dsc.verify(out)
    assert not report.ok and "symbolic link" in str(report.problems)
    out2 = copy(datasets, "fixed", tmp_path / "b")  # a linked directory component
    shutil.move(out2 / "image/c", tmp_path / "cdir")
    (out2 / "image/c").symlink_to(tmp_path / "cdir")
    with pytest.raises(dsc.UnsafePathError):
        dsc.open(out2).get_batch(range(len(dsc.open(out2))))


# ----------------------------------------------------------------------------- 18, 23. argument checks
def test_18_23_loader_arguments_are_checked_at_the_call(datasets):
    ds = dsc.open(datasets / "fixed")
    loader = dsc.Loader(ds, batch_size=4)
    state = loader.state_dict()
    with pytest.raises(dsc.ConfigError, match="batches_served is -3"):
        loader.load_state_dict({**state, "batches_served": -3})
    with pytest.raises(dsc.ConfigError, match="lacks dataset"):
        loader.load_state_dict({k: v for k, v in state.items() if k != "dataset"})
    with pytest.raises(dsc.ConfigError, match="served 99 batches"):
        loader.load_state_dict({**state, "batches_served": 99})
    with pytest.raises(TypeError, match="integers"):
        ds.get_batch([0.7])
    with pytest.raises(dsc.ConfigError, match="batch_size"):
        dsc.Loader(ds, batch_size=2.5)
    with pytest.raises(dsc.ConfigError, match="epoch"):
        loader.set_epoch(-1)
    for device in ("mps", "xpu", "meta"):
        with pytest.raises(dsc.ConfigError, match="'cpu' or 'cuda"):
            dsc.Loader(ds, batch_size=4, device=device)
    for kw, match in ((dict(rank=1.5, world_size=2), "rank must be an int"), (dict(drop_last="no"), "drop_last"),
                      (dict(order="quasi_random", window=True), "window"), (dict(prefetch=10 ** 7), "at most 256")):
        with pytest.raises(dsc.ConfigError, match=match):
            dsc.Loader(ds, batch_size=4, **kw)


def test_18_closing_or_resuming_a_loader_mid_epoch_is_not_a_quiet_end(datasets):
    ds = dsc.open(datasets / "fixed")
    for interrupt, match in ((lambda L, s: L.close(), "loader.close"), (lambda L, s: L.load_state_dict(s),
                                                                         "load_state_dict")):
        loader = dsc.Loader(ds, batch_size=4)
        state = loader.state_dict()
        got = 0
        with pytest.raises(dsc.DscError, match=match):
            for _ in loader:
                got += 1
                if got == 2:
                    interrupt(loader, state)
        assert got == 2
    loader = dsc.Loader(ds, batch_size=4)
    assert len(list(loader)) == len(loader)
    loader.close()  # after a finished epoch: nothing to interrupt


# ----------------------------------------------------------------------------- 13. packaging
def _link_distribution_closure(name, dest):
    """A folder of links to the installed files of distribution ``name`` and of what it requires, recursively
    (their dist-info folders too, so pip sees them installed): a venv that lists the folder in a .pth file
    imports them as installed here."""
    import importlib.metadata as md
    import re

    from packaging.markers import Marker

    dest.mkdir()
    seen, todo = set(), [name]
    while todo:
        dist = md.distribution(todo.pop())
        key = re.sub(r"[-_.]+", "-", dist.metadata["Name"]).lower()
        if key in seen:
            continue
        seen.add(key)
        site = Path(dist.locate_file(""))
        for top in {f.parts[0] for f in dist.files or ()}:
            if top not in ("..", "__pycache__") and not top.endswith(".pth") and not (dest / top).exists():
                (dest / top).symlink_to(site / top)
        for req in dist.requires or ():
            spec, _, marker = req.partition(";")
            if not marker or Marker(marker).evaluate({"extra": ""}):
                todo.append(re.match(r"[A-Za-z0-9_.-]+", spec)[0])
    return dest


@pytest.mark.skipif(os.environ.get("DSC_SKIP_INSTALL_TEST") == "1", reason="DSC_SKIP_INSTALL_TEST=1")
def test_13_installed_without_extras_every_command_runs(tmp_path, scenes_src):
    """A fresh venv, dsc installed without extras (torch first, as the Makefile does), every CLI command
    once: what dsc imports must be what setup.cfg declares. The torch the suite runs on (the Makefile's pin) and
    its own requirements are linked into the venv rather than installed again (a 1 GB copy: most of this test's
    time); TORCH_SPEC in the environment installs that spec with pip instead. Everything else comes from pip
    reading setup.cfg."""
    repo = Path(__file__).resolve().parents[1]
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], check=True)  # (this pip installs there)
    pip = [sys.executable, "-m", "pip", "--python", str(venv / "bin/python"), "install", "--quiet",
           "--disable-pip-version-check"]
    if os.environ.get("TORCH_SPEC"):
        subprocess.run(pip + [os.environ["TORCH_SPEC"]], check=True, capture_output=True, timeout=600)
    else:
        site = subprocess.run([str(venv / "bin/python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                              check=True, capture_output=True, text=True).stdout.strip()
        (Path(site) / "_suite_torch.pth").write_text(f"{_link_distribution_closure('torch', tmp_path / 'torch')}\n")
    subprocess.run(pip + [str(repo)], check=True, capture_output=True, timeout=600)
    exe = str(venv / "bin/dsc")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    from dsc.synthetic import detection_scenes, write_coco, write_voc, write_yolo

    scenes = detection_scenes(3, seed=1)
    ann, images = write_coco(tmp_path / "coco", scenes)
    voc, yolo = write_voc(tmp_path / "voc", scenes), write_yolo(tmp_path / "yolo", scenes)
    out = tmp_path / "ds"

    def run(*args, code=0):
        r = subprocess.run([exe, *map(str, args)], env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path)
        assert r.returncode == code and "Traceback" not in r.stderr, (args, r.stdout, r.stderr)
        return r
    run("--help")
    run("compile", "--help")
    run("compile", "imagefolder", scenes_src, out, "--size", "16", "-q")
    run("compile", "coco", "--annotations", ann, "--images", images, tmp_path / "c", "-q")
    run("compile", "yolo", yolo, tmp_path / "y", "-q")
    run("compile", "voc", voc, tmp_path / "v", "-q")
    assert "pyarrow" in run("compile", "table", tmp_path / "t.parquet", tmp_path / "t", code=1).stderr
    run("info", out)
    run("info", "--env")
    run("verify", out)
    run("bench", out, "--batch-size", "8", "--epochs", "1")
    run("preview", tmp_path / "c", "-o", tmp_path / "p.png")


def test_1_the_default_pixel_limit_is_dscs_and_max_pixels_raises_it(tmp_path):
    (tmp_path / "src/a").mkdir(parents=True)
    Image.new("L", (10000, 9000)).save(tmp_path / "src/a/big.png", compress_level=1)  # 90 M > PIL's 89.5 M
    r = cli("compile", "imagefolder", tmp_path / "src", tmp_path / "o1", "--size", "16", "-q")
    assert r.exit_code == 1 and "10000x9000 = 90,000,000 pixels is more than the 89,478,485 allowed" in r.output
    assert "--max-pixels" in r.output
    r = cli("compile", "imagefolder", tmp_path / "src", tmp_path / "o2", "--size", "16", "--max-pixels",
            "100000000", "-q")
    assert r.exit_code == 0, r.output
    assert dsc.open(tmp_path / "o2")[0]["image"].shape == (16, 16, 3)


def test_1_transforms_on_a_tiny_wide_image_need_no_huge_intermediate(tmp_path):
    """Resize(224) + CenterCrop(224) in the Loader on a stored 1x4000 image: the window only (before, the
    224 x 896,000 resize first: about 880 MB)."""
    (tmp_path / "src/a").mkdir(parents=True)
    rng = np.random.default_rng(0)
    Image.fromarray(rng.integers(0, 256, (1, 4000, 3), dtype=np.uint8)).save(tmp_path / "src/a/wide.png")
    Image.fromarray(rng.integers(0, 256, (30, 40, 3), dtype=np.uint8)).save(tmp_path / "src/a/small.png")
    dsc.compile_imagefolder(tmp_path / "src", tmp_path / "out", progress=False, workers=1)  # ragged, as decoded
    code = ("import re, dsc, sys\nfrom dsc import transforms as T\n"
            "L = dsc.Loader(dsc.open(sys.argv[1]), batch_size=2, num_threads=1, transforms=[T.Resize(224), "
            "T.CenterCrop(224), T.ToFloat()])\nb = next(iter(L))\nprint('SHAPE', tuple(b['image'].shape))\n"
            "print('RSS', re.search(r'VmHWM:\\s+(\\d+)', open('/proc/self/status').read())[1])")
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path / "out")], env=ENV, capture_output=True, text=True,
                       timeout=300)
    assert "SHAPE (2, 3, 224, 224)" in r.stdout, r.stderr
    assert int(r.stdout.split("RSS")[-1]) / 1024 < 450


def test_7_reads_are_bounded_by_what_the_manifest_records(datasets, tmp_path, scenes_src):
    """A file swapped for a huge (sparse) one is refused from its size, before any byte is read; a huge
    zarr.json in a source folder is not read whole; a zarr.json that is a link is refused, not 'missing'."""
    out = copy(datasets, "fixed", tmp_path)
    with open(node_file(out, "keys/c/0"), "r+b") as f:
        f.truncate(6 << 30)  # sparse: no disk used
    with pytest.raises(dsc.CorruptDatasetError, match="the manifest records"):
        dsc.open(out).keys  # read lazily
    report = dsc.verify(out)
    assert not report.ok and "keys/c/0" in str(report.problems)
    src = tmp_path / "src"
    shutil.copytree(scenes_src, src)
    (src / "class_00" / "zarr.json").write_bytes(b"")
    with open(src / "class_00" / "zarr.json", "r+b") as f:
        f.truncate(2 << 30)
    r = dsc.compile_imagefolder(src, tmp_path / "o", size=8, progress=False, workers=1)
    assert r.manifest.classes[0] == "class_00"  # a folder with a huge zarr.json is not taken for a dataset
    linked = copy(datasets, "ragged", tmp_path / "l")
    record = manifest_file(linked)
    record.rename(tmp_path / "real.json")
    record.symlink_to(tmp_path / "real.json")
    with pytest.raises(dsc.UnsafePathError, match="symbolic link"):
        dsc.open(linked)
