"""Segmentation masks: segfolder, VOC --masks, COCO --masks semantic; every resize policy and EXIF
orientation against a PIL reference; COCO shapes against independent rasterisers; transforms keep masks
aligned; verify, info, zarr-python."""
import json
import shutil

import numpy as np
import pytest
import torch
from PIL import Image

import dsc
from dsc import transforms as T
from dsc.synthetic import (DET_CATEGORIES, SEG_CLASSES, SEG_COLORS, detection_scenes, seg_image, seg_mask,
                           seg_scenes, write_coco, write_segfolder, write_voc_segmentation)

from damage import write_node
from reference import ref_mask

POLICIES = [dict(size=(40, 56), resize="center-crop"), dict(size=48, resize="center-crop"),
            dict(size=(40, 56), resize="stretch"), dict(size=(40, 56), resize="pad"), dict(max_side=64), dict()]
IDS = ["center-crop", "center-crop-square", "stretch", "pad", "ragged-max-side", "ragged"]


@pytest.fixture(scope="module")
def seg(tmp_path_factory):
    scenes = seg_scenes(8, seed=1)
    root = write_segfolder(tmp_path_factory.mktemp("seg") / "src", scenes)
    return root, scenes


@pytest.mark.parametrize("opts", POLICIES, ids=IDS)
def test_segfolder_masks_equal_the_pil_reference(seg, tmp_path, opts):
    """Every policy, every EXIF orientation (8 scenes), masks stored in the displayed or the raw frame."""
    root, scenes = seg
    out = tmp_path / "out"
    dsc.compile_segfolder(root, out, classes=list(SEG_CLASSES), progress=False, workers=2, **opts)
    ds = dsc.open(out)
    assert ds.manifest.task == "segmentation" and ds.manifest.format_version == 4
    assert len(ds) == len(scenes) and {s["orientation"] for s in scenes} == set(range(1, 9))
    for i, s in enumerate(scenes):
        sample = ds[i]
        ref = ref_mask(seg_mask(s), size=opts.get("size") if not isinstance(opts.get("size"), int) else
                       (opts["size"],) * 2, resize=opts.get("resize", "center-crop"), max_side=opts.get("max_side"))
        assert ds.keys[i] == f"images/{s['file']}.png"
        assert sample["mask"].dtype == torch.uint8 and sample["mask"].shape == sample["image"].shape[:2]
        np.testing.assert_array_equal(sample["mask"].numpy(), ref, err_msg=f"scene {i} {opts}")
    assert dsc.verify(out).ok


@pytest.mark.parametrize("opts", [dict(size=48), dict()], ids=["center-crop-square", "ragged"])
def test_tiff_images_turn_their_masks_once(tmp_path, opts):
    """TIFF images with every orientation (Pillow turns a TIFF as it loads it): masks in the displayed or the
    raw frame land as with PNG images, the recorded sizes are the displayed ones, the pixels are upright."""
    scenes = seg_scenes(8, seed=1)
    root = write_segfolder(tmp_path / "src", scenes, ext=".tif")
    out = tmp_path / "out"
    dsc.compile_segfolder(root, out, classes=list(SEG_CLASSES), progress=False, workers=2, **opts)
    ds = dsc.open(out)
    size = (opts["size"],) * 2 if opts else None
    for i, s in enumerate(scenes):
        assert ds.keys[i] == f"images/{s['file']}.tif"
        assert ds.orig_sizes[i].tolist() == [s["height"], s["width"]]
        mask = ref_mask(seg_mask(s), size=size)
        np.testing.assert_array_equal(ds[i]["mask"].numpy(), mask, err_msg=f"scene {i}")
        if not opts:  # every pixel the colour of its class: upright, not turned twice
            np.testing.assert_array_equal(ds[i]["image"].numpy(), np.asarray(seg_image(s)), err_msg=f"scene {i}")


def test_truncated_and_empty_mask_files_are_skipped_named(seg, tmp_path, monkeypatch):
    """A mask file cut short is a recorded skip even where the calling process set LOAD_TRUNCATED_IMAGES; an
    empty one says so; neither message holds an object's address."""
    from PIL import ImageFile

    monkeypatch.setattr(ImageFile, "LOAD_TRUNCATED_IMAGES", True)
    root, scenes = seg
    src = tmp_path / "src"
    shutil.copytree(root, src)
    cut = src / "masks" / f"{scenes[0]['file']}.png"
    cut.write_bytes(cut.read_bytes()[:-40])
    (src / "masks" / f"{scenes[1]['file']}.png").write_bytes(b"")
    (src / "masks" / f"{scenes[2]['file']}.png").write_bytes(b"not an image at all")
    r = dsc.compile_segfolder(src, tmp_path / "out", classes=list(SEG_CLASSES), size=32, progress=False,
                              on_error="skip")
    reasons = {s["key"].split("/")[-1]: s["reason"] for s in r.skipped}
    assert "cannot decode mask: image file is truncated" in reasons[f"{scenes[0]['file']}.png"]
    assert "the mask file is empty (0 bytes)" in reasons[f"{scenes[1]['file']}.png"]
    assert reasons[f"{scenes[2]['file']}.png"].endswith("cannot decode mask: cannot identify image file")
    assert len(dsc.open(tmp_path / "out")) == len(scenes) - 3


def test_masks_batch_in_every_form(seg, tmp_path):
    root, scenes = seg
    dsc.compile_segfolder(root, tmp_path / "r", max_side=60, progress=False, workers=1)
    ds = dsc.open(tmp_path / "r")
    idx = [5, 0, 3]
    packed = ds.get_batch(idx)
    assert packed["mask_shapes"].tolist() == [list(ds[i]["mask"].shape) for i in idx]
    padded = ds.get_batch(idx, images="padded")
    for k, i in enumerate(idx):
        h, w = ds[i]["mask"].shape
        assert torch.equal(padded["mask"][k, :h, :w], ds[i]["mask"])
        assert (padded["mask"][k, h:] == 255).all() and (padded["mask"][k, :, w:] == 255).all()  # padded: ignore
    items = ds.__getitems__(idx)
    assert all(torch.equal(items[k]["mask"], ds[i]["mask"]) for k, i in enumerate(idx))
    dl = torch.utils.data.DataLoader(ds, batch_size=4, collate_fn=dsc.collate)
    assert sum(len(b["index"]) for b in dl) == len(ds)


def test_missing_missized_and_bad_masks_are_sample_errors(seg, tmp_path):
    root, scenes = seg
    src = tmp_path / "src"
    shutil.copytree(root, src)
    (src / "masks" / f"{scenes[0]['file']}.png").unlink()  # missing
    Image.new("L", (7, 9)).save(src / "masks" / f"{scenes[1]['file']}.png")  # mis-sized
    Image.new("RGB", (scenes[2]["width"], scenes[2]["height"])).save(src / "masks" / f"{scenes[2]['file']}.png")
    bad = seg_mask(scenes[3]).copy()
    bad[0, 0] = 9  # not one of the 5 classes
    Image.fromarray(bad).save(src / "masks" / f"{scenes[3]['file']}.png")
    if scenes[3]["raw_mask"]:
        pytest.skip("scene 3 is stored raw")
    with pytest.raises(dsc.SampleError, match="no mask") as e:
        dsc.compile_segfolder(src, tmp_path / "a", classes=list(SEG_CLASSES), size=32, progress=False)
    image = next(p.name for p in (src / "images").iterdir() if p.stem == scenes[0]["file"])
    assert str(e.value).startswith(f"images/{image}: no mask file {src / 'masks' / scenes[0]['file']}.<ext>")
    assert str(e.value).count(image) == 1  # the image is named once, by its key (not again by its path)
    r = dsc.compile_segfolder(src, tmp_path / "b", classes=list(SEG_CLASSES), size=32, progress=False,
                              on_error="skip", workers=2, shard_size=2)
    reasons = {s["key"].split("/")[-1]: s["reason"] for s in r.skipped}
    assert len(reasons) == 4
    assert "no mask" in reasons[f"{scenes[0]['file']}.png"]
    assert "the mask is 7x9 but its image is" in reasons[f"{scenes[1]['file']}.png"]
    assert "a mask holds one class id per pixel" in reasons[f"{scenes[2]['file']}.png"]
    assert "mask value 9 is neither a class id (0..4) nor the ignore index 255" in reasons[f"{scenes[3]['file']}.png"]
    ds = dsc.open(tmp_path / "b")  # the shards were compacted: masks stay with their images
    assert len(ds) == 4
    for i, key in enumerate(ds.keys):
        s = next(s for s in scenes if key.endswith(f"{s['file']}.png"))
        np.testing.assert_array_equal(ds[i]["mask"].numpy(), ref_mask(seg_mask(s), size=(32, 32)))
    assert dsc.verify(tmp_path / "b").ok


def test_wide_class_ids_are_stored_as_uint16_and_zarr_reads_them(tmp_path):
    import zarr

    rng = np.random.default_rng(0)
    names = [f"c{k}" for k in range(300)]
    (tmp_path / "src/images").mkdir(parents=True)
    (tmp_path / "src/masks").mkdir()
    masks = []
    for k in range(3):
        m = rng.integers(0, 300, (20, 30)).astype(np.uint16)
        m[0, 0] = 299
        masks.append(m)
        Image.fromarray(m).save(tmp_path / f"src/masks/{k}.png")  # 16-bit grey PNG
        Image.new("RGB", (30, 20), (k, k, k)).save(tmp_path / f"src/images/{k}.png")
    (tmp_path / "classes.txt").write_text("\n".join(names))
    with pytest.raises(dsc.ConfigError, match="ignore index 255 is the id of class 'c255'.*65535"):
        dsc.compile_segfolder(tmp_path / "src", tmp_path / "x", classes_file=tmp_path / "classes.txt", progress=False)
    for opts in (dict(size=(20, 30), resize="stretch"), dict()):
        out = tmp_path / f"out{len(opts)}"
        dsc.compile_segfolder(tmp_path / "src", out, classes_file=tmp_path / "classes.txt", progress=False,
                              mask_ignore=65535, **opts)
        ds = dsc.open(out)
        assert ds.manifest.fields["mask"]["dtype"] == "uint16" and ds[0]["mask"].dtype == torch.uint16
        for k in range(3):
            np.testing.assert_array_equal(ds[k]["mask"].numpy(), masks[k])
        g = zarr.open_group(out, mode="r")
        if opts:
            np.testing.assert_array_equal(g["mask"][:], np.stack(masks))
        else:
            np.testing.assert_array_equal(g["mask/values"]["0"][:], np.concatenate([m.reshape(-1) for m in masks]))
        # uint16 masks go through the batched transforms too (nearest, ignore fill)
        b = T.Compose([T.Letterbox(40)])(ds.get_batch([0, 1]))
        assert b["mask"].dtype == torch.uint16 and b["mask"].shape == (2, 40, 40)
        assert int(b["mask"][0, 0, 0]) == 65535  # the letterbox bar: the dataset's ignore index


def test_voc_masks(tmp_path):
    from dsc.compiler.sources.voc import VOC_CLASSES

    scenes = detection_scenes(10, seed=4)
    root = write_voc_segmentation(tmp_path / "voc", scenes)
    r = dsc.compile_voc(root, tmp_path / "out", split="train", masks=True, size=(64, 64), resize="pad",
                        progress=False)
    ds = dsc.open(tmp_path / "out")
    assert ds.classes == list(VOC_CLASSES) and ds.manifest.fields["mask"]["classes"][0] == "background"
    assert r.manifest.task == "detection"
    for i, s in enumerate(scenes):
        disp = np.asarray(Image.open(root / "SegmentationClass" / f"{s['file'][:-4]}.png"))
        np.testing.assert_array_equal(ds[i]["mask"].numpy(), ref_mask(disp, size=(64, 64), resize="pad"))
        sample = ds[i]
        for box, lab in zip(sample["boxes"].tolist(), sample["labels"].tolist()):  # mask value = box label + 1
            cx, cy = int((box[0] + box[2]) / 2), int((box[1] + box[3]) / 2)
            assert int(sample["mask"][cy, cx]) == lab + 1
    assert (torch.stack([ds[i]["mask"] for i in range(len(ds))]) == 255).any()  # borders and padding
    with pytest.raises(dsc.SourceError, match="ImageSets/Segmentation"):
        dsc.compile_voc(root, tmp_path / "x", split="val", masks=True, progress=False)


def _ref_coco_mask(scene, ignore=255):
    """Displayed-frame reference: the rectangles in annotation order, label + 1, crowd as ignore."""
    m = np.zeros((scene["height"], scene["width"]), np.uint8)
    for b, lab, crowd in zip(scene["boxes"], scene["labels"], scene["iscrowd"]):
        m[b[1]:b[3], b[0]:b[2]] = ignore if crowd else lab + 1
    return m


def test_coco_semantic_masks_follow_frames_and_crowds(tmp_path):
    scenes = detection_scenes(12, seed=6)
    ann, images = write_coco(tmp_path / "coco", scenes, segmentation=True)
    for opts in (dict(size=(48, 64), resize="stretch"), dict(max_side=100)):
        out = tmp_path / f"out{len(opts)}"
        dsc.compile_coco(ann, images, out, masks="semantic", progress=False, workers=2, **opts)
        ds = dsc.open(out)
        assert ds.manifest.fields["mask"]["classes"] == ["background"] + [n for _, n in DET_CATEGORIES]
        for i, s in enumerate(scenes):
            size = opts.get("size")
            ref = ref_mask(_ref_coco_mask(s), size=size, resize="stretch", max_side=opts.get("max_side"))
            np.testing.assert_array_equal(ds[i]["mask"].numpy(), ref, err_msg=f"scene {i} raw={s['raw_frame']}")
    data = json.loads(ann.read_text())
    del data["annotations"][0]["segmentation"]
    ann.write_text(json.dumps(data))
    with pytest.raises(dsc.SourceError, match="no usable 'segmentation'"):
        dsc.compile_coco(ann, images, tmp_path / "bad", masks="semantic", progress=False)


def _inside_polygon(poly, h, w):
    """Independent rasteriser: pixel centres inside the polygon (even-odd rule)."""
    xs, ys = np.meshgrid(np.arange(w) + 0.5, np.arange(h) + 0.5)
    inside = np.zeros((h, w), bool)
    p = np.asarray(poly, float).reshape(-1, 2)
    for (x0, y0), (x1, y1) in zip(p, np.roll(p, -1, 0)):
        crosses = (y0 > ys) != (y1 > ys)
        with np.errstate(divide="ignore", invalid="ignore"):
            xc = x0 + (ys - y0) * (x1 - x0) / (y1 - y0)
        inside ^= crosses & (xs < xc)
    return inside


def _rle_decode(counts, h, w):
    """Independent decoder of COCO's uncompressed RLE: column-major runs starting with zeros."""
    flat, v = [], 0
    for c in counts:
        flat += [v] * c
        v = 1 - v
    return np.array(flat, bool).reshape(w, h).T


def test_coco_rasteriser_against_independent_references(tmp_path):
    from dsc.compiler.masks import rasterize, segmentation_mask

    rng = np.random.default_rng(3)
    agree = total = 0
    for t in range(200):
        h, w = int(rng.integers(8, 60)), int(rng.integers(8, 60))
        k = int(rng.integers(3, 8))
        ang = np.sort(rng.uniform(0, 2 * np.pi, k))  # star-shaped (possibly concave) polygons
        r = rng.uniform(2, min(h, w) / 2, k)
        cx, cy = rng.uniform(0, w), rng.uniform(0, h)
        poly = np.stack([cx + r * np.cos(ang), cy + r * np.sin(ang)], 1).reshape(-1).tolist()
        ours = segmentation_mask([poly], h, w)
        ref = _inside_polygon(poly, h, w)
        agree += int((ours == ref).sum())
        total += ours.size
        flat = rng.random((h, w)) < 0.3
        col = flat.T.reshape(-1)
        bounds = np.concatenate([[0], np.flatnonzero(col[1:] != col[:-1]) + 1, [col.size]])
        counts = ([0] if col[0] else []) + np.diff(bounds).tolist()
        np.testing.assert_array_equal(segmentation_mask({"size": [h, w], "counts": counts}, h, w), flat)
        np.testing.assert_array_equal(_rle_decode(counts, h, w), flat)
    assert agree / total > 0.99  # they differ only in which boundary pixels count as inside
    # draw order: later over earlier; crowd (-1) paints the ignore index
    square = lambda a, b: [[a, a, b, a, b, b, a, b]]  # noqa: E731
    m = rasterize(((square(0, 8), 1), (square(2, 6), 2), (square(3, 4), -1)), 10, 10, 255, "uint8", "t")
    assert m[1, 1] == 1 and m[2, 2] == 2 and m[3, 3] == 255 and m[9, 9] == 0
    pycoco = pytest.importorskip("pycocotools.mask")
    for t in range(300):
        h, w = int(rng.integers(1, 50)), int(rng.integers(1, 50))
        polys = [rng.uniform(-4, max(h, w) + 4, 2 * int(rng.integers(3, 8))).tolist() for _ in range(2)]
        ref = pycoco.decode(pycoco.merge(pycoco.frPyObjects(polys, h, w))).astype(bool)
        np.testing.assert_array_equal(segmentation_mask(polys, h, w), ref)  # exactly pycocotools' masks
        rle = pycoco.encode(np.asfortranarray(ref.astype(np.uint8)))
        np.testing.assert_array_equal(segmentation_mask({"size": [h, w], "counts": rle["counts"].decode()}, h, w), ref)


def _class_of_pixels(img: np.ndarray) -> np.ndarray:
    """The class whose colour each pixel has (the scenes paint class k in SEG_COLORS[k]), or -1 where the
    pixel blends two colours (bilinear resampling at a shape's edge) and so has no class of its own."""
    d = np.abs(img[..., None, :].astype(int) - np.asarray(SEG_COLORS)[None, None]).max(-1)
    return np.where(d.min(-1) <= 12, d.argmin(-1), -1)


@pytest.mark.parametrize("chain", [
    [T.RandomResizedCrop(40, scale=(0.2, 1.0)), T.RandomHorizontalFlip(), T.RandomVerticalFlip()],
    [T.Letterbox((48, 40), fill=0), T.RandomHorizontalFlip()],
    [T.Resize(50), T.CenterCrop(36)],
], ids=["rrc-flips", "letterbox-flip", "resize-centercrop"])
@pytest.mark.parametrize("layout", ["fixed", "ragged"])
def test_loader_keeps_masks_aligned_with_images(seg, tmp_path, chain, layout):
    root, scenes = seg
    opts = dict(size=(56, 56)) if layout == "fixed" else dict(max_side=72)
    dsc.compile_segfolder(root, tmp_path / "out", classes=list(SEG_CLASSES), progress=False, **opts)
    loader = dsc.Loader(dsc.open(tmp_path / "out"), batch_size=3, order="random", seed=2, transforms=chain)
    agree = total = ignored = 0
    for epoch in range(3):
        loader.set_epoch(epoch)
        for b in loader:
            assert b["mask"].shape == b["image"].shape[:3] and b["mask"].dtype == torch.uint8
            mask, img = b["mask"].numpy(), b["image"].numpy()
            cls = _class_of_pixels(img)
            ignored += int((mask == 255).sum())
            valid = (mask != 255) & (cls >= 0)  # a misaligned mask disagrees where the pixels are pure
            agree += int((cls[valid] == mask[valid]).sum())
            total += int(valid.sum())
    assert total > 0 and agree / total >= 0.99, agree / total
    if isinstance(chain[0], T.Letterbox):
        assert ignored > 0  # the bars are the ignore index


def test_python_dataset_of_image_mask_pairs(seg, tmp_path):
    root, scenes = seg
    from dsc.synthetic import seg_image

    items = [(seg_image(s), Image.fromarray(seg_mask(s))) for s in scenes]
    dsc.compile(items, tmp_path / "out", classes=list(SEG_CLASSES), size=32, progress=False, workers=2)
    ds = dsc.open(tmp_path / "out")
    assert ds.manifest.task == "segmentation"
    for i, s in enumerate(scenes):
        np.testing.assert_array_equal(ds[i]["mask"].numpy(), ref_mask(seg_mask(s), size=(32, 32)))


def test_verify_detects_a_flipped_mask_byte_and_info_shows_the_field(seg, tmp_path):
    from click.testing import CliRunner

    from dsc.cli import main

    root, _ = seg
    out = tmp_path / "out"
    r = CliRunner().invoke(main, ["compile", "segfolder", str(root), str(out), "--size", "32", "--classes",
                                  ",".join(SEG_CLASSES), "--shard-size", "4", "-q"])
    assert r.exit_code == 0, r.output
    assert "mask: fixed 32x32 uint8 class ids" in r.output
    info = CliRunner().invoke(main, ["info", str(out)])
    assert "mask      fixed 32x32 uint8 class ids" in info.output and "ignore index 255" in info.output
    shard = out / "mask/c/1/0/0"
    data = bytearray(shard.read_bytes())
    data[32 * 32 + 5] ^= 0x40  # sample 5 = the second sample of shard 1
    shard.write_bytes(bytes(data))
    report = dsc.verify(out)
    assert not report.ok and report.damaged_samples == [5]
    assert any(p.file == "mask/c/1/0/0" for p in report.problems)
    r = CliRunner().invoke(main, ["verify", str(out)])
    assert r.exit_code == 1 and "mask/c/1/0/0" in r.output


def test_more_bad_masks(tmp_path):
    # VOC: a listed image without its SegmentationClass PNG
    scenes = detection_scenes(4, seed=9)
    root = write_voc_segmentation(tmp_path / "voc", scenes)
    (root / "SegmentationClass" / f"{scenes[1]['file'][:-4]}.png").unlink()
    r = dsc.compile_voc(root, tmp_path / "v", split="train", masks=True, size=32, on_error="skip", progress=False)
    assert len(r.skipped) == 1 and "the mask of id scene_001 (listed in train.txt) is missing" in r.skipped[0]["reason"]
    # COCO: an RLE of another size than its image
    ann, images = write_coco(tmp_path / "coco", scenes, segmentation=True)
    data = json.loads(ann.read_text())
    data["annotations"][0]["segmentation"] = {"size": [3, 4], "counts": [12]}
    ann.write_text(json.dumps(data))
    r = dsc.compile_coco(ann, images, tmp_path / "c", masks="semantic", size=32, on_error="skip", progress=False)
    assert len(r.skipped) == 1 and "its RLE is 4x3 but the image is" in r.skipped[0]["reason"]
    # segfolder without class names: 8-bit masks decide uint8; a 16-bit mask with a value past 255 cannot fit
    (tmp_path / "s/images").mkdir(parents=True)
    (tmp_path / "s/masks").mkdir()
    for k, m in enumerate([np.full((6, 6), 3, np.uint8), np.full((6, 6), 300, np.uint16)]):
        Image.new("RGB", (6, 6)).save(tmp_path / f"s/images/{k}.png")
        Image.fromarray(m).save(tmp_path / f"s/masks/{k}.png")
    r = dsc.compile_segfolder(tmp_path / "s", tmp_path / "so", on_error="skip", progress=False)
    assert len(r.skipped) == 1 and "mask value 300 does not fit the dataset's uint8 masks" in r.skipped[0]["reason"]


@pytest.mark.parametrize("seg", [
    {"size": [0, 0], "counts": [2 ** 62, 2 ** 62, 2 ** 62, 2 ** 62 + 1200]},  # wraps around in int64
    {"size": [0, 0], "counts": [2 ** 70, 0]},
    {"size": [0, 0], "counts": "o" * 40 + "0"},  # compressed, malformed
    [[0, 0, 1e12, 0, 0, 10]],  # a vertex absurdly far outside: each edge would be walked
], ids=["rle-wrap", "rle-huge", "rle-string", "far-polygon"])
def test_hostile_coco_segmentations_are_sample_errors(tmp_path, seg):
    scenes = detection_scenes(3, seed=5)
    ann, images = write_coco(tmp_path / "coco", scenes, segmentation=True)
    data = json.loads(ann.read_text())
    a = next(a for a in data["annotations"] if a["image_id"] == 100)
    if isinstance(seg, dict):
        seg = {**seg, "size": [scenes[0]["height"], scenes[0]["width"]]}
    a["segmentation"], a["iscrowd"] = seg, 0
    ann.write_text(json.dumps(data))
    r = dsc.compile_coco(ann, images, tmp_path / "out", masks="semantic", size=16, on_error="skip", progress=False,
                         workers=1)
    assert [s["key"] for s in r.skipped] == [scenes[0]["file"]] and "cannot rasterise" in r.skipped[0]["reason"]


def test_coco_annotation_without_a_segmentation_is_a_skippable_sample(tmp_path):
    scenes = detection_scenes(4, seed=8)
    ann, images = write_coco(tmp_path / "coco", scenes, segmentation=True)
    data = json.loads(ann.read_text())
    data["annotations"][0]["segmentation"] = []
    ann.write_text(json.dumps(data))
    with pytest.raises(dsc.SampleError, match="no usable 'segmentation'"):
        dsc.compile_coco(ann, images, tmp_path / "a", masks="semantic", size=16, progress=False)
    r = dsc.compile_coco(ann, images, tmp_path / "b", masks="semantic", size=16, progress=False, on_error="skip")
    assert len(r.skipped) == 1 and r.manifest.num_samples == 3


def test_two_masks_for_one_image_are_refused_not_picked(seg, tmp_path):
    root, scenes = seg
    src = tmp_path / "src"
    shutil.copytree(root, src)
    Image.fromarray(seg_mask(scenes[0])).save(src / "masks" / f"{scenes[0]['file']}.bmp")
    Image.new("L", (4, 4)).save(src / "masks" / "orphan.png")
    r = dsc.compile_segfolder(src, tmp_path / "out", size=16, on_error="skip", progress=False)
    assert len(r.skipped) == 1 and "2 mask files for it" in r.skipped[0]["reason"]
    assert any("orphan" in w for w in r.warnings)


@pytest.mark.parametrize("edit", ["dtype", "height", "shards", "image-shards"])
def test_a_mask_field_that_does_not_fit_the_dataset_is_refused(seg, tmp_path, edit):
    from damage import edit_manifest, list_shards

    root, _ = seg
    out = tmp_path / "out"
    dsc.compile_segfolder(root, out, size=16, shard_size=4, progress=False)

    def damage(m):
        f = m["fields"]["mask"]
        if edit == "dtype":
            f["dtype"] = "uint16"
        elif edit == "height":
            f["height"] = 8
        elif edit == "shards":
            f["shards"] = f["shards"][:1]
        else:
            f["shards"] = m["shards"]
    if edit in ("shards", "image-shards"):  # (the shards listed in the manifest: format 3)
        list_shards(out)
    edit_manifest(out, damage)
    with pytest.raises(dsc.CorruptDatasetError, match="mask"):
        dsc.open(out)
    try:
        report = dsc.verify(out)
    except dsc.CorruptDatasetError:
        pass
    else:  # (a shard table's entries are checked as verify reads them: a problem reported, naming the mask)
        assert not report.ok and any("mask" in str(p) for p in report.problems), report.problems


def test_ragged_mask_shapes_must_be_the_image_shapes(seg, tmp_path):
    from dsc.formats.zarr_v3 import read_plain_array, write_plain_array

    root, _ = seg
    out = tmp_path / "out"
    dsc.compile_segfolder(root, out, max_side=40, progress=False)
    shapes = read_plain_array(out, "mask/shapes").copy()
    shapes[0] = shapes[0][::-1]  # same size in bytes, the sides swapped
    scratch = tmp_path / "scratch"
    write_plain_array(scratch, "mask/shapes", shapes, ["sample", "axis"])
    for f in (scratch / "mask" / "shapes").rglob("*"):
        if f.is_file():  # into the version dsc reads, with its size and hash recorded (a careful forger)
            write_node(out, f.relative_to(scratch).as_posix(), f.read_bytes(), record=True)
    with pytest.raises(dsc.CorruptDatasetError, match="mask shapes differ from the image shapes"):
        dsc.open(out)
    report = dsc.verify(out)
    assert not report.ok and any("another size than their images" in p.what for p in report.problems)


def test_preview_draws_masks_and_the_dataset_names_them(seg, tmp_path):
    root, scenes = seg
    dsc.compile_segfolder(root, tmp_path / "out", classes=list(SEG_CLASSES), size=32, progress=False)
    ds = dsc.open(tmp_path / "out")
    assert ds.mask_classes == list(SEG_CLASSES) and ds.ignore_index == 255 and ds.classes == list(SEG_CLASSES)
    from dsc.runtime.preview import cell_origin

    dsc.preview(ds, tmp_path / "p.png", n=4, cols=2, cell=32)
    png = np.asarray(Image.open(tmp_path / "p.png").convert("RGB")).astype(int)
    mask, img = ds[0]["mask"].numpy(), ds[0]["image"].numpy().astype(int)
    ys, xs = np.nonzero(mask != 0)
    ox, oy = cell_origin(0, 2, 32)
    assert (np.abs(png[oy + ys, ox + xs] - img[ys, xs]).max(axis=1) > 10).mean() > 0.9  # painted over
    ys, xs = np.nonzero(mask == 0)
    assert np.abs(png[oy + ys, ox + xs] - img[ys, xs]).max() <= 1  # background left clear
