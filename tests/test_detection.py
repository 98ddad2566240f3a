"""Detection: boxes follow their image through EXIF and every resize policy; COCO, YOLO and VOC agree;
batch forms round-trip; preview draws boxes where they are; malformed sources give one-line errors."""
import json
import shutil

import numpy as np
import pytest
import torch
import zarr
from click.testing import CliRunner
from PIL import Image

import dsc
from dsc.cli import main
from dsc.runtime.batches import packed_to_list, padded_to_packed
from dsc.runtime.preview import CAPTION, class_color, cell_origin
from dsc.synthetic import DET_CATEGORIES, detection_scenes, write_coco, write_voc, write_yolo
from reference import reference

POLICIES = [dict(size=(96, 96), resize="pad", fill=0), dict(size=(64, 80), resize="center-crop"),
            dict(size=(70, 50), resize="stretch"), dict(max_side=90), dict()]
IDS = ["pad", "center-crop", "stretch", "max-side", "as-is"]


@pytest.fixture(scope="module")
def scenes():
    return detection_scenes(15, seed=4)


@pytest.fixture(scope="module")
def sources(scenes, tmp_path_factory):
    root = tmp_path_factory.mktemp("det")
    ann, images = write_coco(root / "coco", scenes)
    return {"coco": (ann, images), "yolo": write_yolo(root / "yolo", scenes), "voc": write_voc(root / "voc", scenes)}


def expected_boxes(scene, affine, out_w, out_h):
    """Reference: displayed-frame boxes through the reference affine, clipped, degenerate dropped."""
    b = np.array(scene["boxes"], np.float64).reshape(-1, 4)
    sx, sy, tx, ty = affine
    t = np.stack([b[:, 0] * sx + tx, b[:, 1] * sy + ty, b[:, 2] * sx + tx, b[:, 3] * sy + ty], 1)
    t[:, [0, 2]] = t[:, [0, 2]].clip(0, out_w)
    t[:, [1, 3]] = t[:, [1, 3]].clip(0, out_h)
    keep = (t[:, 2] > t[:, 0]) & (t[:, 3] > t[:, 1])
    return t[keep], np.array(scene["labels"], np.int64)[keep], np.array(scene["colors"]).reshape(-1, 3)[keep]


@pytest.mark.parametrize("opts", POLICIES, ids=IDS)
def test_coco_boxes_follow_every_policy(scenes, sources, tmp_path, opts):
    ann, images = sources["coco"]
    report = dsc.compile_coco(ann, images, tmp_path / "out", progress=False, shard_size=4, **opts)
    ds = dsc.open(tmp_path / "out")
    assert len(ds) == len(scenes) and ds.classes == ["cat", "dog", "bird"]
    assert ds.manifest.category_ids == (3, 7, 12)
    dropped = 0
    for i, scene in enumerate(scenes):
        s = ds[i]
        assert ds.keys[i] == scene["file"] and s["image_id"] == 100 + i
        assert s["orig_size"] == (scene["height"], scene["width"])
        want_img, affine = reference(images / scene["file"], **opts)
        np.testing.assert_array_equal(s["image"].numpy(), want_img)
        h, w = want_img.shape[:2]
        boxes, labels, colors = expected_boxes(scene, affine, w, h)
        dropped += len(scene["boxes"]) - len(boxes)
        np.testing.assert_allclose(s["boxes"].numpy(), boxes, atol=1e-3, err_msg=scene["file"])
        np.testing.assert_array_equal(s["labels"].numpy(), labels)
        img = s["image"].numpy().astype(int)
        for (x0, y0, x1, y1), color in zip(boxes, colors):  # the box still frames its drawn shape
            if x1 - x0 >= 6 and y1 - y0 >= 6:
                inner = img[int(np.ceil(y0)) + 2:int(y1) - 2, int(np.ceil(x0)) + 2:int(x1) - 2]
                assert np.abs(inner - color).max() <= 3, scene["file"]
            for side in (img[int(y0) - 2, int(x0):int(x1)] if y0 >= 2 else None,
                         img[int(np.ceil(y1)) + 1, int(x0):int(x1)] if y1 + 2 <= h else None):
                if side is not None and len(side):
                    assert np.abs(side.mean(0) - color).max() > 20, f"{scene['file']}: box is not tight"
    assert report.manifest.objects["dropped_boxes"] == dropped
    frames = zarr.open_group(tmp_path / "out", mode="r")["transform/box_frame"][:]
    assert frames.tolist() == [int(s["raw_frame"]) for s in scenes]


@pytest.mark.parametrize("opts", [dict(size=(64, 80), resize="center-crop"), dict()], ids=["center-crop", "as-is"])
def test_tiff_boxes_turn_once_with_their_image(tmp_path, opts):
    """TIFF images with every orientation (Pillow turns a TIFF as it loads it), boxes in the displayed or the
    raw frame: the same samples as PNG images of the same scenes."""
    scenes = {ext: detection_scenes(10, seed=4, ext=ext) for ext in (".png", ".tif")}
    data = {}
    for ext, sc in scenes.items():
        ann, images = write_coco(tmp_path / ext[1:], sc)
        dsc.compile_coco(ann, images, tmp_path / f"out{ext}", progress=False, shard_size=4, **opts)
        data[ext] = dsc.open(tmp_path / f"out{ext}")
    png, tif = data[".png"], data[".tif"]
    assert tif.keys == [s["file"] for s in scenes[".tif"]]
    np.testing.assert_array_equal(tif.orig_sizes, png.orig_sizes)
    assert tif.orig_sizes.tolist() == [[s["height"], s["width"]] for s in scenes[".tif"]]
    for key in ("transform/box_frame", "transform/exif_orientation"):
        np.testing.assert_array_equal(zarr.open_group(tmp_path / "out.tif", mode="r")[key][:],
                                      zarr.open_group(tmp_path / "out.png", mode="r")[key][:])
    for i in range(len(tif)):
        np.testing.assert_array_equal(tif[i]["image"].numpy(), png[i]["image"].numpy(), err_msg=tif.keys[i])
        np.testing.assert_array_equal(tif[i]["boxes"].numpy(), png[i]["boxes"].numpy(), err_msg=tif.keys[i])


def test_yolo_and_voc_compile_to_the_same_boxes_as_coco(sources, tmp_path):
    opts = dict(size=(64, 80), resize="center-crop", progress=False)
    dsc.compile_coco(*sources["coco"], tmp_path / "coco", **opts)
    dsc.compile_yolo(sources["yolo"], tmp_path / "yolo", split="train", **opts)
    dsc.compile_voc(sources["voc"], tmp_path / "voc", classes=["cat", "dog", "bird"], **opts)
    ref = dsc.open(tmp_path / "coco")
    for other in ("yolo", "voc"):
        ds = dsc.open(tmp_path / other)
        assert len(ds) == len(ref) and ds.classes == ["cat", "dog", "bird"]
        for i in range(len(ds)):
            np.testing.assert_allclose(ds[i]["boxes"].numpy(), ref[i]["boxes"].numpy(), atol=1e-3)
            assert torch.equal(ds[i]["labels"], ref[i]["labels"])
            assert torch.equal(ds[i]["image"], ref[i]["image"])
    voc = dsc.open(tmp_path / "voc")
    assert "difficult" in voc[0] and voc.manifest.objects["attributes"] == {"difficult": "uint8", "truncated": "uint8"}


def test_voc_classes_found_are_sorted_and_coco_ids_can_be_kept(sources, tmp_path):
    dsc.compile_voc(sources["voc"], tmp_path / "voc", size=32, progress=False)
    assert dsc.open(tmp_path / "voc").classes == ["bird", "cat", "dog"]
    dsc.compile_coco(*sources["coco"], tmp_path / "ids", size=32, keep_category_ids=True, progress=False)
    ds = dsc.open(tmp_path / "ids")
    ids = {i for i, _ in DET_CATEGORIES}
    assert set(torch.cat([ds[i]["labels"] for i in range(len(ds))]).tolist()) <= ids
    assert ds.classes[3] == "cat" and ds.classes[12] == "bird"


def test_drop_empty_and_negatives(sources, scenes, tmp_path):
    dsc.compile_coco(*sources["coco"], tmp_path / "all", size=32, progress=False)
    dsc.compile_coco(*sources["coco"], tmp_path / "some", size=32, progress=False, drop_empty_images=True)
    empty = sum(1 for s in scenes if not s["boxes"])
    assert empty and len(dsc.open(tmp_path / "all")) == len(scenes)
    assert len(dsc.open(tmp_path / "some")) == len(scenes) - empty
    assert dsc.open(tmp_path / "all").manifest.objects["images_without_boxes"] == empty


def test_batch_forms_round_trip(sources, tmp_path):
    dsc.compile_coco(*sources["coco"], tmp_path / "d", max_side=70, progress=False, shard_size=4)
    ds = dsc.open(tmp_path / "d")
    idx = [7, 0, 4, 12, 3]
    packed = ds.get_batch(idx)
    assert packed["box_offsets"].tolist()[0] == 0 and len(packed["box_offsets"]) == len(idx) + 1
    cols = {k: packed[k] for k in ("boxes", "labels", "iscrowd", "area")}
    as_list = packed_to_list(packed["box_offsets"], cols)
    for k, i in enumerate(idx):
        for name in cols:
            assert torch.equal(as_list[k][name], ds[i][name])
    padded = ds.get_batch(idx, boxes="padded")
    assert padded["boxes"].shape == (5, int(padded["box_counts"].max()), 4)
    assert (padded["labels"][~padded["box_mask"]] == -1).all()
    offsets, back = padded_to_packed({k: padded[k] for k in (*cols, "box_mask", "box_counts")})
    assert torch.equal(offsets, packed["box_offsets"])
    for name in cols:
        assert torch.equal(back[name], packed[name])
    targets = ds.get_batch(idx, boxes="list")["targets"]
    assert [t["image_id"] for t in targets] == [ds[i]["image_id"] for i in idx]
    assert all(torch.equal(t["boxes"], ds[i]["boxes"]) for t, i in zip(targets, idx))
    # Ragged images: packed bytes + shapes, or padded to the batch's largest with the true sizes
    img = ds.get_batch(idx, images="padded")
    for k, i in enumerate(idx):
        h, w = img["image_sizes"][k].tolist()
        assert torch.equal(img["image"][k, :h, :w], ds[i]["image"])
        assert (img["image"][k, h:] == 0).all() and (img["image"][k, :, w:] == 0).all()
    # torch DataLoader through dsc.collate keeps the packed form
    loader = torch.utils.data.DataLoader(ds, batch_size=4, collate_fn=dsc.collate)
    assert sum(int(b["box_offsets"][-1]) for b in loader) == ds.manifest.objects["num_boxes"]
    assert torch.equal(ds.__getitems__(idx)[2]["boxes"], ds[4]["boxes"])
    for form, key in (("padded", "box_mask"), ("list", "targets")):  # per-sample views in every batch form
        batch = dsc.open(tmp_path / "d", boxes=form).__getitems__(idx)
        assert key in batch.fields and "box_offsets" not in batch.fields
        for k, i in enumerate(idx):
            assert all(torch.equal(batch[k][name], ds[i][name]) for name in cols)
            assert batch[k]["image_id"] == ds[i]["image_id"]


def test_predictions_map_back_to_original_coordinates(sources, scenes, tmp_path):
    dsc.compile_coco(*sources["coco"], tmp_path / "d", size=(96, 96), resize="pad", progress=False)
    ds = dsc.open(tmp_path / "d")
    for i, scene in enumerate(scenes):
        if scene["boxes"]:
            np.testing.assert_allclose(ds.to_original(i, ds[i]["boxes"].numpy()), scene["boxes"], atol=1e-3)


def test_preview_draws_boxes_where_they_are(sources, tmp_path):
    dsc.compile_coco(*sources["coco"], tmp_path / "d", size=(64, 64), resize="stretch", progress=False)
    out = tmp_path / "p.png"
    r = CliRunner().invoke(main, ["preview", str(tmp_path / "d"), "-o", str(out), "--n", "4", "--cols", "2",
                                  "--cell", "128"])
    assert r.exit_code == 0, r.output
    im = np.asarray(Image.open(out).convert("RGB"))
    assert im.shape == (2 * (128 + CAPTION), 2 * 128, 3)
    ds = dsc.open(tmp_path / "d")
    checked = 0
    for k in range(4):
        ox, oy = cell_origin(k, 2, 128)
        for box, label in zip(ds[k]["boxes"].tolist(), ds[k]["labels"].tolist()):
            x0, _, x1, y1 = (ox + box[0] * 2, oy + box[1] * 2, ox + box[2] * 2, oy + box[3] * 2)
            xm = int((x0 + x1) / 2)
            assert tuple(im[int(round(y1)), xm]) == class_color(label) or tuple(im[int(y1), xm]) == class_color(label)
            checked += 1
    assert checked
    r = CliRunner().invoke(main, ["preview", str(tmp_path / "d"), "-o", str(tmp_path / "q.png"), "--n", "2"])
    assert r.exit_code == 0


def test_preview_classification(scenes_src, tmp_path):
    dsc.compile_imagefolder(scenes_src, tmp_path / "c", size=32, progress=False)
    path = dsc.preview(dsc.open(tmp_path / "c"), tmp_path / "c.png", n=5, cell=40)
    assert Image.open(path).size == (3 * 40, 2 * (40 + CAPTION))


# ----------------------------------------------------------------------------- malformed sources
def _cli(*args):
    r = CliRunner().invoke(main, [str(a) for a in args])
    assert "Traceback" not in r.output and (r.exception is None or isinstance(r.exception, SystemExit))
    return r


def _coco_case(sources, tmp_path, edit):
    ann, images = sources["coco"]
    data = json.loads(ann.read_text())
    text = edit(data)
    path = tmp_path / "ann.json"
    path.write_text(text if isinstance(text, str) else json.dumps(data))
    return _cli("compile", "coco", "--annotations", path, "--images", images, tmp_path / "out", "--size", "32", "-q")


def _set(d, path, value):
    *keys, last = path
    for k in keys:
        d = d[k]
    d[last] = value


COCO_CASES = {
    "malformed JSON": (lambda d: '{"images": [1,\n  oops]}', ["ann.json:2:", "malformed JSON"]),
    "missing image": (lambda d: _set(d, ["annotations", 0, "image_id"], 999), ["annotation 1", "image_id 999"]),
    "unknown category": (lambda d: _set(d, ["annotations", 1, "category_id"], 5), ["annotation 2", "category_id 5"]),
    "duplicate image ids": (lambda d: _set(d, ["images", 1, "id"], 100), ["duplicate image id 100"]),
    "bad bbox": (lambda d: _set(d, ["annotations", 0, "bbox"], [1, 2]), ["annotation 1", "bbox"]),
    "NaN box": (lambda d: json.dumps(d).replace('"bbox": [', '"bbox": [NaN, ', 1).replace(", ", ",", 0),
                ["NaN or infinite"]),
    "negative size": (lambda d: _set(d, ["annotations", 0, "bbox"], [10, 10, -5, 20]),
                      ["annotation 1 has bbox [10, 10, -5, 20] with a negative width (-5)", "[x, y, width, height]"]),
    "outside": (lambda d: _set(d, ["annotations", 0, "bbox", 0], 5000), ["lies outside"]),
    "wrong size": (lambda d: _set(d, ["images", 0, "width"], 17), ["annotation says the image is 17x"]),
}


@pytest.mark.parametrize("case", COCO_CASES)
def test_coco_errors_are_one_line(sources, tmp_path, case):
    edit, needles = COCO_CASES[case]
    if case == "NaN box":  # make the first bbox 5 numbers long then drop one: [NaN, x, y, w]
        def edit(d):
            d["annotations"][0]["bbox"] = [float("nan")] + d["annotations"][0]["bbox"][1:]
            return json.dumps(d)
    r = _coco_case(sources, tmp_path, edit)
    assert r.exit_code == 1, r.output
    lines = [ln for ln in r.output.splitlines() if ln.strip() and not ln.startswith("note: ")]  # + resume hint
    assert len(lines) == 1 and lines[0].startswith("Error:"), r.output
    for n in needles:
        assert n in r.output, (n, r.output)


def test_coco_wrong_images_folder_says_none_of_the_files_is_there(sources, tmp_path):
    """A wrong --images stops at once, saying that none of the listed files is there and where they are,
    instead of 'No such file or directory' for the first one."""
    ann, images = sources["coco"]
    n = len(json.loads(ann.read_text())["images"])
    r = _cli("compile", "coco", "--annotations", ann, "--images", images.parent, tmp_path / "out", "--size", "32", "-q")
    assert r.exit_code == 1, r.output
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and f"none of the {n} images {ann.name} lists is in this folder" in lines[0], r.output
    assert "pass as --images the folder their file_name entries are relative to" in lines[0]
    assert f"({images} has " in lines[0] and "No such file" not in r.output


def test_bad_box_is_skipped_with_skip(sources, tmp_path):
    ann, images = sources["coco"]
    data = json.loads(ann.read_text())
    data["annotations"][0]["bbox"][2] = -3
    path = tmp_path / "ann.json"
    path.write_text(json.dumps(data))
    report = dsc.compile_coco(path, images, tmp_path / "out", size=32, on_error="skip", progress=False)
    assert [s["key"] for s in report.skipped] == ["scene_000.png"]
    assert "negative width" in report.skipped[0]["reason"]


def test_yolo_errors(sources, tmp_path):
    root = tmp_path / "y"
    shutil.copytree(sources["yolo"], root)
    lbl = sorted((root / "labels" / "train").glob("*.txt"))[0]
    lbl.write_text("0 0.5 0.5 0.1 0.1\n1 0.5 0.5 zero 0.1\n")
    r = _cli("compile", "yolo", root, tmp_path / "out", "--size", "32", "-q")
    assert r.exit_code == 1 and f"{lbl.name}:2:" in r.output and "Traceback" not in r.output
    lbl.write_text("7 0.5 0.5 0.1 0.1\n")
    r = _cli("compile", "yolo", root, tmp_path / "out", "--size", "32", "-q")
    assert r.exit_code == 1 and f"{lbl.name}:1: class 7" in r.output
    r = _cli("compile", "yolo", root, tmp_path / "out", "--split", "val", "-q")
    assert r.exit_code == 1 and "no split 'val'" in r.output


def test_voc_errors(sources, tmp_path):
    root = tmp_path / "v"
    shutil.copytree(sources["voc"], root)
    xml = sorted((root / "Annotations").glob("*.xml"))[1]
    xml.write_text("<annotation>\n<size><width>3</width></size>\n<object>\n</annotation>")
    r = _cli("compile", "voc", root, tmp_path / "out", "--size", "32", "-q")
    assert r.exit_code == 1 and f"{xml.name}:4:" in r.output and "malformed XML" in r.output
    r = _cli("compile", "voc", root, tmp_path / "out", "--split", "test", "-q")
    assert r.exit_code == 1 and "no such split file" in r.output and "trainval" in r.output
    xml.unlink()
    r = _cli("compile", "voc", root, tmp_path / "out", "--size", "32", "-q")
    assert r.exit_code == 1 and "annotation file missing" in r.output
    r = _cli("compile", "voc", root, tmp_path / "out", "--size", "32", "-q", "--on-error", "skip")
    assert r.exit_code == 0 and "skipped 1" in r.output
