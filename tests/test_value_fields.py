"""Value fields (numbers, arrays, ragged arrays, text, json, bytes): every target a Python dataset gives is
stored as it was given, read back exactly by ds[i], batches, the Loader and zarr-python, and bad values are
one-line errors naming the sample and the field."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import dsc
from dsc.errors import ConfigError, SampleError, SourceError
from dsc.runtime.batches import collate

N = 10
RNG = np.random.default_rng(31)
IMAGES = [RNG.integers(0, 255, (12 + i % 3, 14, 3), np.uint8) for i in range(N)]
EMB = RNG.standard_normal((N, 8)).astype(np.float16)


def compile_targets(out, targets, **kw):
    kw.setdefault("size", (8, 8))
    dsc.compile(list(zip(IMAGES, targets)), out, workers=1, progress=False, **kw)
    return dsc.open(out)


def rich(i: int) -> dict:
    return {"label": i % 3, "score": 0.1 * i + 0.05, "weight": np.float32(1 / (i + 1)), "caption": f"a cat nº{i} 🐈",
            "tags": list(range(i % 4)), "emb": EMB[i], "meta": {"url": f"http://x/{i}", "n": [i, None]},
            "blob": bytes([i, 0, 255]) * i, "flag": i % 2 == 0}


def same(a, b) -> bool:
    """Equal values and dtype, bytes for bytes."""
    if isinstance(b, np.ndarray) or isinstance(b, np.generic):
        a = a.numpy() if isinstance(a, torch.Tensor) else np.asarray(a)
        return a.dtype == b.dtype and a.shape == np.shape(b) and a.tobytes() == np.asarray(b).tobytes()
    return type(a) is type(b) and a == b


def test_regression_target_is_a_number_not_class_labels(out):
    targets = [0.3 * i + 0.1 for i in range(N)]  # was truncated to class labels 0, 0, 0, 1...
    ds = compile_targets(out, targets)
    assert ds.manifest.task == "images" and ds.manifest.classes == ()
    assert ds.manifest.fields == {"target": {"kind": "number", "dtype": "float64"}}
    assert [ds[i]["target"].item() for i in range(N)] == targets  # bit-exact float64
    batch = next(iter(dsc.Loader(ds, batch_size=N, order="sequential")))
    assert batch["target"].dtype == torch.float64 and batch["target"].tolist() == targets
    images, target = next(iter(dsc.Loader(ds, batch_size=4, format="torchvision")))
    assert target.tolist() == targets[:4]


def test_dict_target_every_kind_round_trips(out):
    ds = compile_targets(out, [rich(i) for i in range(N)])
    f = ds.manifest.fields
    assert ds.manifest.task == "classification" and "label" not in f
    assert {k: v["kind"] for k, v in f.items()} == {"score": "number", "weight": "number", "caption": "text",
                                                   "tags": "ragged", "emb": "array", "meta": "json", "blob": "bytes",
                                                   "flag": "number"}
    assert (f["score"]["dtype"], f["weight"]["dtype"], f["tags"]["dtype"], f["emb"]["dtype"], f["emb"]["shape"],
            f["flag"]["dtype"]) == ("float64", "float32", "int64", "float16", [8], "bool")
    for i in range(N):
        s, want = ds[i], rich(i)
        assert s["label"] == want["label"]
        assert s["score"].item() == want["score"] and same(s["weight"], np.asarray(want["weight"]))
        assert same(s["emb"], EMB[i]) and same(s["tags"], np.asarray(want["tags"], np.int64))
        assert s["caption"] == want["caption"] and s["blob"] == want["blob"] and s["meta"] == want["meta"]
        assert s["flag"].item() is want["flag"]
    # a Loader epoch: numbers and arrays gathered beside the pixels, ragged packed, text/json/bytes as lists
    idx = [7, 2, 9, 0]
    loader = dsc.Loader(ds, batch_size=4, order="random", seed=3, keys=("image", "emb", "tags", "tags_offsets",
                                                                        "caption", "meta", "blob", "score", "index"))
    seen = 0
    for image, emb, tags, tags_off, caption, meta, blob, score, index in loader:
        for k, i in enumerate(index.tolist()):
            want = rich(i)
            assert same(emb[k], EMB[i]) and score[k].item() == want["score"]
            assert tags[tags_off[k]:tags_off[k + 1]].tolist() == want["tags"]
            assert (caption[k], meta[k], blob[k]) == (want["caption"], want["meta"], want["blob"])
            assert torch.equal(image[k], ds[i]["image"])
            seen += 1
    assert seen == N
    # get_batch, the list form, DataLoader's __getitems__ + dsc.collate
    b = ds.get_batch(idx, boxes="list")
    assert [t.tolist() for t in b["tags"]] == [rich(i)["tags"] for i in idx] and "tags_offsets" not in b
    samples = ds.__getitems__(idx)
    assert [s["caption"] for s in samples] == [rich(i)["caption"] for i in idx]
    assert [s["tags"].tolist() for s in samples] == [rich(i)["tags"] for i in idx]
    assert collate(samples)["meta"] == [rich(i)["meta"] for i in idx]
    images, targets = next(iter(dsc.Loader(ds, batch_size=3, format="torchvision")))
    assert targets["label"].tolist() == [0, 1, 2] and targets["caption"] == [rich(i)["caption"] for i in range(3)]
    assert [t.tolist() for t in targets["tags"]] == [rich(i)["tags"] for i in range(3)]


def test_host_fields_are_not_sent_to_the_device(out):
    from dsc.runtime.prefetch import _to_device

    ds = compile_targets(out, [rich(i) for i in range(N)])
    b = _to_device(ds.get_batch([1, 2]), torch.device("cpu"))
    assert [type(m) for m in b["meta"]] == [dict, dict] and b["meta"] == [rich(1)["meta"], rich(2)["meta"]]


def test_transforms_leave_fields_untouched(out):
    from dsc import transforms as T

    ds = compile_targets(out, [rich(i) for i in range(N)])
    loader = dsc.Loader(ds, batch_size=N, transforms=[T.RandomHorizontalFlip(1.0)])
    b = next(iter(loader))
    order = b["index"].tolist()
    assert torch.equal(b["emb"], torch.from_numpy(EMB[order]))
    assert b["caption"] == [rich(i)["caption"] for i in order]


def test_zarr_python_reads_the_fields(out):
    zarr = pytest.importorskip("zarr")
    compile_targets(out, [rich(i) for i in range(N)])
    g = zarr.open_group(str(out), mode="r")
    assert np.array_equal(g["emb"][:], EMB) and g["emb"].dtype == np.float16
    assert g["score"][:].tolist() == [rich(i)["score"] for i in range(N)]
    values, offsets = g["caption/values"][:], g["caption/offsets"][:]
    assert [values[offsets[i]:offsets[i + 1]].tobytes().decode() for i in range(N)] == [rich(i)["caption"]
                                                                                        for i in range(N)]
    tv, to = g["tags/values"][:], g["tags/offsets"][:]
    assert [tv[to[i]:to[i + 1]].tolist() for i in range(N)] == [rich(i)["tags"] for i in range(N)]
    mv, mo = g["meta/values"][:], g["meta/offsets"][:]
    assert json.loads(mv[mo[3]:mo[4]].tobytes()) == rich(3)["meta"]


def test_multi_label_ids_and_multi_hot(out, tmp_path):
    tags = [[1, 3], [0], [], [2, 1, 0], [1], [3], [0], [2], [1, 2], [3, 0]]
    names = ["a", "b", "c", "d"]
    ds = compile_targets(out, tags, classes=names)  # a bare list of ints: ragged ids named by the classes
    assert ds.manifest.fields["target"] == {"kind": "ragged", "dtype": "int64", "shape": [], "classes": names}
    assert [ds[i]["target"].tolist() for i in range(N)] == tags
    ds = compile_targets(tmp_path / "hot", tags, classes=names, fields={"target": "multihot"})
    assert ds.manifest.fields["target"]["shape"] == [4]
    hot = ds.get_batch(range(N))["target"]
    assert hot.dtype == torch.uint8 and [set(np.flatnonzero(r.numpy())) for r in hot] == [set(t) for t in tags]
    with pytest.raises(SampleError, match=r"dataset\[1\].*'target'.*class id 7"):
        compile_targets(tmp_path / "bad", [[0], [7]] + tags[2:], classes=names)


def test_declared_fields(out):
    targets = [{"score": 0.1 * i, "emb": EMB[i].astype(np.float64)} for i in range(N)]
    ds = compile_targets(out, targets, fields={"score": "float32", "emb": ("float16", (8,))})
    assert ds.manifest.fields["score"] == {"kind": "number", "dtype": "float32"}
    assert [ds[i]["score"].item() for i in range(N)] == [float(np.float32(0.1 * i)) for i in range(N)]
    assert all(same(ds[i]["emb"], EMB[i]) for i in range(N))
    with pytest.raises(ConfigError, match="'emb'"):
        compile_targets(out, targets, fields={"emb": "float16[x]"}, overwrite=True)


def test_detection_target_keeps_boxes_and_stores_other_keys(out):
    targets = [{"boxes": [[1, 1, 5, 6]], "labels": [i % 2], "caption": f"cap {i}", "iscrowd": [0]} for i in range(N)]
    ds = compile_targets(out, targets)
    assert ds.manifest.task == "detection" and set(ds.manifest.fields) == {"caption"}
    assert ds[4]["caption"] == "cap 4" and ds[4]["boxes"].shape == (1, 4)
    loader = dsc.Loader(ds, batch_size=5, format="torchvision")
    _, targets_out = next(iter(loader))
    assert [t["caption"] for t in targets_out] == [f"cap {i}" for i in range(5)]


@pytest.mark.parametrize("bad, match", [
    ({"c": b"\xff\xfe"}, r"dataset\[4\]: field 'c': not valid UTF-8"),
    ({"e": np.zeros(3, np.float16)}, r"dataset\[4\]: field 'e': an array of shape \(3,\)"),
    ({"m": {"x": object()}}, r"dataset\[4\]: field 'm': the value does not serialise"),
    ({"s": float("nan")}, r"dataset\[4\]: field 's': NaN"),
    ({"i": 1.5}, r"dataset\[4\]: field 'i': 1.5 does not fit the field's int64"),
    ({"c": 3}, r"dataset\[4\]: field 'c': expected text"),
    ({"c": None}, r"dataset\[4\]: has no value for field 'c'"),
    ({"z": 1}, r"dataset\[4\]: gives field 'z'"),
    ({"m": {"a": [{2: "x"}]}}, r"dataset\[4\]: field 'm': json object keys must be str: the value\['a'\]\[0\] has "
                              r"the key 2 \(int\)"),  # json.dumps would have made it "2"
    ({"i": 2 ** 70}, r"dataset\[4\]: field 'i': the value 1180591620717411303424 does not fit int64"),
])
def test_bad_values_name_the_sample_and_the_field(out, bad, match):
    good = {"c": "x", "e": np.zeros(2, np.float16), "m": {"a": 1}, "s": 1.0, "i": 2}
    targets = [dict(good) for _ in range(N)]
    targets[4] = {k: v for k, v in {**good, **bad}.items() if v is not None}
    with pytest.raises(SampleError, match=match) as e:
        compile_targets(out, targets)
    assert "\n" not in str(e.value)
    ds = compile_targets(out, targets, on_error="skip", overwrite=True)
    assert len(ds) == N - 1 and [s["key"] for s in ds.manifest.skipped] == ["4"]


def test_ragged_over_declared_maximum(out):
    targets = [{"ids": list(range(i % 5))} for i in range(N)]
    with pytest.raises(SampleError, match=r"dataset\[4\]: field 'ids': 4 rows, more than the declared maximum of 3"):
        compile_targets(out, targets, fields={"ids": ("int64", (None,), 3)})


def test_mismatch_with_the_first_sample(out):
    targets = [{"label": 0, "emb": EMB[i]} for i in range(N)]
    targets[6] = {"label": 0, "emb": EMB[6].astype(np.float32) + np.float32(1e-4)}
    with pytest.raises(SampleError, match=r"dataset\[6\]: field 'emb': float32 values does not fit the field's "
                                          r"float16 exactly \(the field was inferred from the first sample"):
        compile_targets(out, targets)
    with pytest.raises(SourceError, match="'label'"):
        compile_targets(out, [{"label": 0.5}] * N, overwrite=True)


def test_collate_of_samples_is_a_loader_batch(out):
    """dsc.collate of ds[i] dicts (torch's default_collate path: a wrapper such as ConcatDataset does not forward
    __getitems__) gives what a Loader batch gives, for every field kind: ragged rows of different lengths packed
    with <name>_offsets (default_collate could not stack them), json / text / bytes lists untouched (it
    restructured {"i": 2} per sample into {"i": tensor([2, 2])})."""
    ds = compile_targets(out, [{**rich(i), "meta": {"i": 2}} for i in range(N)])
    idx = [1, 3, 2, 0]

    def same_batch(got, want):
        assert set(got) == set(want) - {"index"}
        for k, v in got.items():
            if isinstance(v, torch.Tensor):
                assert v.dtype == want[k].dtype and torch.equal(v, want[k]), k
            else:
                assert type(v) is list and v == want[k], k

    want = ds.get_batch(idx)
    assert want["tags_offsets"].tolist() == [0, 1, 4, 6, 6] and want["meta"] == [{"i": 2}] * 4
    same_batch(collate([ds[i] for i in idx]), want)
    same_batch(collate([ds[1], ds[3]]), ds.get_batch([1, 3]))
    loader = torch.utils.data.DataLoader(torch.utils.data.ConcatDataset([ds, ds]), batch_size=4, collate_fn=dsc.collate)
    batches = list(loader)
    assert len(batches) == 5
    for b, start in zip(batches, range(0, 2 * N, 4)):
        same_batch(b, ds.get_batch([i % N for i in range(start, start + 4)]))
    # plain dicts (no schema carried): the same, by the values
    same_batch(collate([dict(ds[i]) for i in idx]), want)


def test_json_lists_and_tuples_read_back_as_lists(out):
    ds = compile_targets(out, [{"m": {"t": (i, "x"), "l": [i]}} for i in range(N)])
    assert ds[3]["m"] == {"t": [3, "x"], "l": [3]}  # JSON has one sequence type (documented)


def test_label_key_misuse_names_the_fix(out):
    fix = r"the key 'label' is one class index, and holds \[1, 2\]; store multi-label ids .* under another name"
    with pytest.raises(SampleError, match=r"dataset\[0\]: " + fix):
        compile_targets(out, [{"label": [1, 2]}] * N)
    with pytest.raises(SampleError, match=r"dataset\[3\]: " + fix):
        compile_targets(out, [{"label": 1}] * 3 + [{"label": [1, 2]}] * (N - 3), overwrite=True)
    with pytest.raises(ConfigError, match=r"'label' is the class index \(an int.*name a regression target"):
        compile_targets(out, [{"label": 1}] * N, fields={"label": "float32"}, overwrite=True)


# ----------------------------------------------------------------------------- tables, COCO captions, updates
def _png(i: int) -> bytes:
    import io

    from PIL import Image

    b = io.BytesIO()
    Image.fromarray(IMAGES[i]).save(b, "PNG")
    return b.getvalue()


def _table(path, captions=None, hf=True):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    t = pa.table({"image": [_png(i) for i in range(N)], "label": [i % 2 for i in range(N)],
                  "score": pa.array([0.25 * i for i in range(N)], pa.float32()),
                  "caption": captions or [f"cap {i}" for i in range(N)],
                  "emb": pa.array(EMB.astype(np.float32).tolist(), pa.list_(pa.float16(), 8)),
                  "tags": [[0, 2][: i % 3] for i in range(N)], "meta": [{"a": i, "b": [1.5]} for i in range(N)],
                  "raw": [bytes([i, 7]) for i in range(N)], "depth": [[[float(i)] * 3] * 2 for i in range(N)],
                  "n16": pa.array(list(range(N)), pa.int16())})
    if hf:
        feats = {"image": {"_type": "Image"}, "label": {"_type": "ClassLabel", "names": ["x", "y"]},
                 "tags": {"_type": "Sequence", "length": -1,
                          "feature": {"_type": "ClassLabel", "names": ["p", "q", "r"]}},
                 "depth": {"_type": "Array2D", "shape": [2, 3], "dtype": "float32"}}
        t = t.replace_schema_metadata({"huggingface": json.dumps({"info": {"features": feats}})})
    pq.write_table(t, path)
    return path


COLUMNS = ("score", "caption", "emb", "tags", "meta", "raw", "depth", "n16:float64")


def test_table_columns_any_kind(tmp_path, out):
    from click.testing import CliRunner

    from dsc.cli import main

    table = _table(tmp_path / "t.parquet")
    args = ["compile", "table", str(table), str(out), "--size", "8x8", "--workers", "1"]
    for c in COLUMNS:
        args += ["--column", c]
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 0, r.output
    ds = dsc.open(out)
    f = ds.manifest.fields
    assert f["score"] == {"kind": "number", "dtype": "float32"} and f["caption"] == {"kind": "text"}
    assert f["emb"] == {"kind": "array", "dtype": "float16", "shape": [8]}  # Arrow fixed-size list
    assert f["tags"]["classes"] == ["p", "q", "r"]  # Sequence(ClassLabel): multi-label
    assert f["depth"] == {"kind": "array", "dtype": "float32", "shape": [2, 3]}  # Array2D
    assert f["n16"] == {"kind": "number", "dtype": "float64"} and f["raw"] == {"kind": "bytes"}
    assert ds.classes == ["x", "y"]
    b = ds.get_batch(range(N))
    assert b["score"].tolist() == [0.25 * i for i in range(N)] and torch.equal(b["emb"], torch.from_numpy(EMB))
    assert b["caption"] == [f"cap {i}" for i in range(N)] and b["raw"] == [bytes([i, 7]) for i in range(N)]
    assert b["meta"] == [{"a": i, "b": [1.5]} for i in range(N)] and b["n16"].dtype == torch.float64
    assert [t.tolist() for t in ds.get_batch(range(N), boxes="list")["tags"]] == [[0, 2][: i % 3] for i in range(N)]
    assert ds[3]["depth"].tolist() == [[3.0] * 3] * 2
    info = CliRunner().invoke(main, ["info", str(out)]).output
    assert "emb       array float16 (8,)" in info and "multi-label ids over 3 classes int64" in info
    assert "ok" in CliRunner().invoke(main, ["verify", str(out)]).output.lower()

    # --update: a changed caption is a changed sample, its pixels kept
    _table(table, captions=[f"cap {i}" if i != 4 else "a new caption" for i in range(N)])
    r = CliRunner().invoke(main, args + ["--update"])
    assert r.exit_code == 0, r.output
    ds = dsc.open(out)
    assert ds.version == 1 and ds.history()[-1]["relabelled"] == 1 and ds.history()[-1]["decoded"] == 0
    assert ds[4]["caption"] == "a new caption" and ds[3]["caption"] == "cap 3"
    assert dsc.open(out, version=0)[4]["caption"] == "cap 4"
    zarr = pytest.importorskip("zarr")
    g = zarr.open_group(str(out), mode="r")  # the plain-Zarr view follows the latest version
    v, o = g["caption/values"][:], g["caption/offsets"][:]
    assert v[o[4]:o[5]].tobytes() == b"a new caption" and np.array_equal(g["emb"][:], EMB)


def test_table_multi_hot_column(tmp_path, out):
    dsc.compile_table(_table(tmp_path / "t.parquet"), out, columns=["tags:multihot"], size=(8, 8), workers=1)
    ds = dsc.open(out)
    assert ds.manifest.fields["tags"] == {"kind": "array", "dtype": "uint8", "shape": [3], "multihot": True,
                                          "classes": ["p", "q", "r"]}
    assert ds.get_batch(range(N))["tags"].tolist() == [[1 if k in [0, 2][: i % 3] else 0 for k in range(3)]
                                                       for i in range(N)]
    with pytest.raises(SourceError, match="multihot needs the column's class names"):
        dsc.compile_table(_table(tmp_path / "u.parquet", hf=False), tmp_path / "u", columns=["tags:multihot"])


def test_table_bad_column(tmp_path, out):
    table = _table(tmp_path / "t.parquet", hf=False)
    with pytest.raises(SourceError, match="no column 'nope'"):
        dsc.compile_table(table, out, columns=["nope"])
    with pytest.raises(SourceError, match="--column 'score:floaty'"):
        dsc.compile_table(table, out, columns=["score:floaty"])
    with pytest.raises(SampleError, match="row 0: field 'n16': expected text"):
        dsc.compile_table(table, out, columns=["n16:text"], workers=1)
    with pytest.raises(SourceError, match=r"--column caption:bytes: the column 'caption' holds strings .* the kind "
                                          r"that fits is text"):  # (was a TypeError from bytes(str))
        dsc.compile_table(table, out, columns=["caption:bytes"], workers=1)


def test_table_hf_kind_that_does_not_fit_names_its_origin(tmp_path, out):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    t = pa.table({"image": [_png(i) for i in range(N)], "label": [0] * N, "score": [0.1 * i for i in range(N)]})
    feats = {"score": {"_type": "Value", "dtype": "float32"}}  # over a float64 Arrow column
    pq.write_table(t.replace_schema_metadata({"huggingface": json.dumps({"info": {"features": feats}})}),
                   tmp_path / "t.parquet")
    with pytest.raises(SampleError, match=r"row 1: field 'score': 0.1 does not fit the field's float32 exactly \(the "
                                          r"field's kind, number float32, came from the table's Hugging Face features "
                                          r"\(Value\('float32'\)\)\); to keep the values, declare it: "
                                          r"--column score:float64"):
        dsc.compile_table(tmp_path / "t.parquet", out, columns=["score"], workers=1, size=(8, 8))
    dsc.compile_table(tmp_path / "t.parquet", out, columns=["score:float64"], workers=1, size=(8, 8), overwrite=True)
    assert dsc.open(out).get_batch(range(N))["score"].tolist() == [0.1 * i for i in range(N)]


def test_coco_captions_beside_boxes(tmp_path, out):
    from dsc.synthetic import detection_scenes, write_coco

    ann, images = write_coco(tmp_path / "coco", detection_scenes(4, seed=2))
    ids = [im["id"] for im in json.loads(ann.read_text())["images"]]
    caps = {"annotations": [{"image_id": i, "id": k, "caption": f"image {i} caption {k}"}
                            for k, i in enumerate(ids * 2) if k != 1]}
    (tmp_path / "captions_train.json").write_text(json.dumps(caps))
    dsc.compile_coco(ann, images, out, captions=tmp_path / "captions_train.json", size=(32, 32), workers=1)
    ds = dsc.open(out)
    assert ds.manifest.task == "detection" and ds.manifest.fields["captions"] == {"kind": "json"}
    want = {i: [c["caption"] for c in caps["annotations"] if c["image_id"] == i] for i in ids}
    assert [ds[k]["captions"] for k in range(4)] == [want[ds[k]["image_id"]] for k in range(4)]
    assert len(ds[0]["boxes"]) > 0


def test_value_parts_round_trip_the_resume_journal(out):
    from dsc.formats.fields import value_field

    for spec, value in [({"kind": "array", "dtype": "float16", "shape": [8]}, EMB[1]),
                        ({"kind": "text"}, "é\0x"), ({"kind": "ragged", "dtype": "int32", "shape": [2]}, [[1, 2]])]:
        f = value_field("v", spec)
        p = f.part(out, 0, 4)
        p.add(f.encode(value, "here"))
        p.pad(1)
        assert f.load_part(json.loads(json.dumps(p.to_json()))).rows == p.rows


def test_resume_keeps_the_fields_of_finished_units(tmp_path):
    """kill -9 once 2 of the 5 units are journaled: --resume keeps them (their value parts come back from the
    journal) and the result is byte-identical to an uninterrupted compile."""
    import signal

    from click.testing import CliRunner

    from conftest import journal_units, stopped_at_unit, tree_bytes
    from dsc.cli import main

    table = _table(tmp_path / "t.parquet")
    argv = lambda out: ["compile", "table", str(table), str(out), "--size", "8x8", "--shard-size", "2",  # noqa: E731
                        "--workers", "1", *[a for c in COLUMNS for a in ("--column", c)]]
    assert CliRunner().invoke(main, argv(tmp_path / "ref")).exit_code == 0
    r = stopped_at_unit(argv(tmp_path / "out"), 2, signal.SIGKILL)
    assert r.returncode == -signal.SIGKILL, r.stderr
    assert [len(journal_units(p)) for p in tmp_path.glob(".out*-tmp")] == [2]
    res = CliRunner().invoke(main, argv(tmp_path / "out") + ["--resume"])
    assert res.exit_code == 0 and "resumed: 2 finished shards" in res.output, res.output
    assert tree_bytes(tmp_path / "out") == tree_bytes(tmp_path / "ref")
    assert dsc.open(tmp_path / "out")[1]["caption"] == "cap 1"


def test_remote_dataset_carries_the_fields(tmp_path, monkeypatch, request):
    pytest.importorskip("obstore")
    pytest.importorskip("moto.server")
    from object_servers import use_server

    server = request.getfixturevalue("s3_server")
    use_server(server, monkeypatch)
    server.bucket("dsc-fields")
    url = "s3://dsc-fields/rich"
    compile_targets(url, [rich(i) for i in range(N)], cache_dir=str(tmp_path / "stage"))
    ds = dsc.open(url, cache_dir=tmp_path / "cache")
    assert ds.remote and set(ds.manifest.fields) >= {"caption", "emb", "tags", "meta"}
    b = next(iter(dsc.Loader(ds, batch_size=N)))
    order = b["index"].tolist()
    assert torch.equal(b["emb"], torch.from_numpy(EMB[order])) and b["caption"] == [rich(i)["caption"] for i in order]
    assert ds[5]["meta"] == rich(5)["meta"]


def test_large_columns_are_mapped_not_read(out, monkeypatch):
    import dsc.formats.fields.columns as C

    compile_targets(out, [rich(i) for i in range(N)])
    monkeypatch.setattr(C, "MAP_AT_LEAST", 1)
    ds = dsc.open(out)
    emb = ds.readers["emb"].values
    assert emb.base is not None and not emb.flags.owndata  # a view of the mapping, not a copy read at open
    assert torch.equal(ds.get_batch(range(N))["emb"], torch.from_numpy(EMB))
    assert [ds[i]["caption"] for i in range(N)] == [rich(i)["caption"] for i in range(N)]


def test_verify_checks_the_fields(out):
    """A careful forger (new bytes recorded in the manifest) still fails verify's checks of each kind."""
    from damage import read_node, write_node

    from dsc.formats.verify import verify

    compile_targets(out, [rich(i) for i in range(N)])
    assert verify(out).ok
    text = bytearray(read_node(out, "caption/values/c/0"))
    text[0] = 0xFF  # not UTF-8 any more
    write_node(out, "caption/values/c/0", bytes(text), record=True)
    meta = bytearray(read_node(out, "meta/values/c/0"))
    meta[0] = ord("#")  # UTF-8, not JSON
    write_node(out, "meta/values/c/0", bytes(meta), record=True)
    score = np.frombuffer(read_node(out, "score/c/0"), np.float64).copy()
    score[2] = np.nan
    write_node(out, "score/c/0", score.tobytes(), record=True)
    problems = {p.file: p for p in verify(out).problems}
    assert problems["caption/values"].samples == [0] and "UTF-8" in problems["caption/values"].what
    assert problems["meta/values"].samples == [0] and "not JSON" in problems["meta/values"].what
    assert problems["score"].samples == [2]


def test_delta_table_columns(tmp_path, out):
    deltalake = pytest.importorskip("deltalake")
    pa = pytest.importorskip("pyarrow")

    rows = pa.table({"image": [_png(i) for i in range(N)], "label": [i % 2 for i in range(N)],
                     "caption": [f"d{i}" for i in range(N)], "score": [0.5 * i for i in range(N)]})
    deltalake.write_deltalake(str(tmp_path / "delta"), rows)
    dsc.compile_delta(str(tmp_path / "delta"), out, columns=["caption", "score:float32"], size=(8, 8), workers=1)
    ds = dsc.open(out)
    assert ds.get_batch(range(N))["caption"] == [f"d{i}" for i in range(N)]
    assert ds.manifest.fields["score"] == {"kind": "number", "dtype": "float32"}
    assert ds.get_batch(range(N))["score"].tolist() == [0.5 * i for i in range(N)]


def test_ragged_rows_of_points(out):
    lines = [np.arange(2 * (i % 4), dtype=np.float32).reshape(-1, 2) for i in range(N)]
    ds = compile_targets(out, [{"line": x} for x in lines], fields={"line": ("float32", (None, 2))})
    assert ds.manifest.fields["line"] == {"kind": "ragged", "dtype": "float32", "shape": [2]}
    assert all(same(ds[i]["line"], lines[i]) for i in range(N))
    b = ds.get_batch(range(N))
    assert b["line"].shape == (sum(len(x) for x in lines), 2) and b["line_offsets"][-1] == len(b["line"])
