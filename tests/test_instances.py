"""Instance masks and keypoints (issue 30): per-object masks pixel-equal to pycocotools' annToMask at native
size (same-class overlaps, crowds, two-polygon objects, RLE holes), through every compile-time resize policy
and EXIF orientation and through the Loader's transforms (objects cut by a crop drop their masks and
joints); keypoints against torchvision's documented flip rule; the batch forms; verify, info, view, update."""
import json

import numpy as np
import pytest
import torch
from PIL import Image

import dsc
from dsc import transforms as T
from dsc.synthetic import write_coco_instances
from dsc.transforms import batch_generator

from reference import ref_mask

pycoco = pytest.importorskip("pycocotools.coco")

FLIP_INDS = [0, 2, 1, 4, 3, 6, 5, 8, 7, 10, 9, 12, 11, 14, 13, 16, 15]  # torchvision's COCO person flip


def tv_flip_keypoints(kps: np.ndarray, width: float) -> np.ndarray:
    """torchvision references/detection/transforms.py ``_flip_coco_person_keypoints``, as documented."""
    flipped = kps[:, FLIP_INDS].copy()
    flipped[..., 0] = width - flipped[..., 0]
    flipped[flipped[..., 2] == 0] = 0
    return flipped


@pytest.fixture(scope="module")
def coco(tmp_path_factory):
    root = tmp_path_factory.mktemp("inst")
    ann, images = write_coco_instances(root / "src", n=6, seed=3)
    out = root / "native"
    dsc.compile_coco(ann, images, out, masks="instance,semantic", progress=False, workers=1)
    return ann, images, out, pycoco.COCO(str(ann))


def _anns(api, image_id):
    return api.loadAnns(api.getAnnIds(imgIds=image_id))


def _iou(a, b):
    a, b = a.astype(bool), b.astype(bool)
    union = (a | b).sum()
    return 1.0 if union == 0 else (a & b).sum() / union


def test_native_masks_equal_ann_to_mask_for_every_object(coco):
    """IoU 1.0 for every object: overlapping people of one class, the crowd (kept, flagged), the two-polygon
    object and the RLE with a hole; the semantic mask is still there; keypoints as annotated."""
    ann, images, out, api = coco
    ds = dsc.open(out)
    assert ds.manifest.fields["masks"]["kind"] == "object_masks" and "mask" in ds.manifest.fields
    n_obj = crowd = overlapping = 0
    for i in range(len(ds)):
        s, anns = ds[i], _anns(api, int(ds[i]["image_id"]))
        assert s["masks"].shape == (len(anns), *s["image"].shape[:2]) and s["masks"].dtype == torch.uint8
        refs = [api.annToMask(a) for a in anns]
        for j, a in enumerate(anns):
            np.testing.assert_array_equal(s["masks"][j].numpy(), refs[j], err_msg=f"image {i} object {j}")
            n_obj += 1
            crowd += a["iscrowd"]
            overlapping += any((refs[j] & refs[k]).any() for k in range(len(anns)) if k != j
                               and anns[k]["category_id"] == a["category_id"])
        assert s["iscrowd"].tolist() == [a["iscrowd"] for a in anns]
        kp = np.array([a.get("keypoints", [0] * 51) for a in anns], np.float32).reshape(-1, 17, 3)
        np.testing.assert_allclose(s["keypoints"].numpy(), kp, atol=1e-4)
    assert n_obj == 6 * 7 and crowd == 6 and overlapping > 6


@pytest.mark.parametrize("opts", [dict(size=(40, 56), resize="center-crop"), dict(size=(40, 56), resize="stretch"),
                                  dict(size=(40, 56), resize="pad"), dict(max_side=50)],
                         ids=["center-crop", "stretch", "pad", "max-side"])
def test_compile_time_policies_and_exif_move_masks_and_keypoints(tmp_path, opts):
    """Every image with another EXIF orientation: masks = annToMask (displayed frame) through the policy with
    the semantic mask's nearest rule; keypoints = the sample's affine map, outside -> (0, 0, 0); objects the
    crop cut away are gone with their masks and joints."""
    ann, images = write_coco_instances(tmp_path / "src", n=8, seed=5, orientations=True)
    api = pycoco.COCO(str(ann))
    out = tmp_path / "out"
    dsc.compile_coco(ann, images, out, masks="instance", progress=False, workers=1, **opts)
    ds = dsc.open(out)
    for i in range(len(ds)):
        s = ds[i]
        anns = _anns(api, int(s["image_id"]))
        oh, ow = s["image"].shape[:2]
        sx, sy, tx, ty = ds.affine[i]
        kept = []
        for a in anns:
            x, y, w, h = a["bbox"]
            b = np.clip([x * sx + tx, y * sy + ty, (x + w) * sx + tx, (y + h) * sy + ty], 0, [ow, oh, ow, oh])
            if np.float32(b[2]) > np.float32(b[0]) and np.float32(b[3]) > np.float32(b[1]):
                kept.append(a)
        assert len(s["masks"]) == len(s["keypoints"]) == len(s["boxes"]) == len(kept)
        for j, a in enumerate(kept):
            ref = ref_mask(api.annToMask(a), size=opts.get("size"), resize=opts.get("resize", "center-crop"),
                           max_side=opts.get("max_side"), ignore=0)
            np.testing.assert_array_equal(s["masks"][j].numpy(), ref, err_msg=f"{opts} image {i} object {j}")
            kp = np.array(a.get("keypoints", [0] * 51), np.float64).reshape(17, 3)
            x, y = kp[:, 0] * sx + tx, kp[:, 1] * sy + ty
            vis = (kp[:, 2] > 0) & (x >= 0) & (x <= ow) & (y >= 0) & (y <= oh)
            ref_kp = np.stack([x, y, kp[:, 2]], 1) * vis[:, None]
            np.testing.assert_allclose(s["keypoints"][j].numpy(), ref_kp, atol=1e-4)


def _crop_nearest(mask: np.ndarray, box, size) -> np.ndarray:
    """A mask cropped to ``box`` (left, top, right, bottom; outside = 0) and resized to ``size`` (h, w) with
    the masks' nearest rule (``_pil_resize``): the reference geometry of a crop + resize."""
    l, t, r, b = (int(v) for v in box)
    h, w = mask.shape
    canvas = np.zeros((b - t, r - l), np.uint8)
    t0, t1, l0, l1 = max(t, 0), min(b, h), max(l, 0), min(r, w)
    if t1 > t0 and l1 > l0:
        canvas[t0 - t:t1 - t, l0 - l:l1 - l] = mask[t0:t1, l0:l1]
    return _nearest_rule(canvas, size[1], size[0])


@pytest.mark.parametrize("threads", [0, 2], ids=["batched", "in-gather"])
def test_loader_transforms_move_masks_and_keypoints(coco, threads):
    """RandomResizedCrop + RandomHorizontalFlip: each kept object's mask against annToMask through the same
    crop, PIL nearest resize and flip (IoU >= 0.98 for >= 99% of objects), its keypoints against the crop map
    and torchvision's flip rule (1e-4 px), objects cut away by the crop dropped with their rows."""
    ann, images, out, api = coco
    ds = dsc.open(out)
    ops = [T.RandomResizedCrop(32, scale=(0.05, 0.4)), T.RandomHorizontalFlip()]
    loader = dsc.Loader(ds, batch_size=3, transforms=ops, num_threads=threads, seed=7)
    ious, dropped, flips = [], 0, 0
    for j, batch in enumerate(loader):
        idx = batch["index"].numpy()
        sizes = ds.sample_sizes(idx)
        gen = batch_generator(7, 0, j)
        top, left, ch, cw = ops[0].params(sizes, gen)
        flip = ops[1].params(sizes, gen)
        o, mo = batch["box_offsets"].tolist(), batch["masks_offsets"]
        for b, i in enumerate(idx.tolist()):
            s = ds[i]
            t, l, h, w = int(top[b]), int(left[b]), int(ch[b]), int(cw[b])
            sx, sy = 32 / w, 32 / h
            boxes = s["boxes"].double().numpy()
            nb = np.stack([(boxes[:, 0] - l) * sx, (boxes[:, 1] - t) * sy, (boxes[:, 2] - l) * sx,
                           (boxes[:, 3] - t) * sy], 1).clip(0, 32)
            keep = (nb[:, 2] > nb[:, 0]) & (nb[:, 3] > nb[:, 1])
            dropped += int((~keep).sum())
            assert o[b + 1] - o[b] == keep.sum()
            got = dsc.runtime.batches.object_masks(batch, "masks", b).numpy()
            kps = s["keypoints"].double().numpy()[keep]
            x, y = (kps[..., 0] - l) * sx, (kps[..., 1] - t) * sy
            vis = (kps[..., 2] > 0) & (x >= 0) & (x <= 32) & (y >= 0) & (y <= 32)
            ref_kp = np.stack([x, y, kps[..., 2]], -1) * vis[..., None]
            for k, m in zip(range(len(got)), s["masks"].numpy()[keep]):
                ref = _crop_nearest(m, (l, t, l + w, t + h), (32, 32))
                ious.append(_iou(got[k], ref[:, ::-1] if flip[b] else ref))
            if flip[b]:
                flips += 1
                ref_kp = tv_flip_keypoints(ref_kp, 32)
            np.testing.assert_allclose(batch["keypoints"][o[b]:o[b + 1]].numpy(), ref_kp, atol=1e-4)
    ious = np.array(ious)
    assert len(ious) > 20 and flips and dropped
    assert (ious >= 0.98).mean() >= 0.99, np.sort(ious)[:5]


def test_torchvision_targets_carry_exact_masks_and_keypoints_without_crowds(coco):
    """format="torchvision": masks (k, H, W) uint8 per object (not the class-mask approximation), keypoints
    (k, 17, 3), crowds left out unless keep_crowd=True; a flip-only chain on mixed-size images runs."""
    ann, images, out, api = coco
    ds = dsc.open(out)
    assert len({tuple(ds[i]["image"].shape) for i in range(len(ds))}) > 1
    loader = dsc.Loader(ds, batch_size=3, format="torchvision", transforms=[T.RandomHorizontalFlip(1.0)],
                        num_threads=0)
    seen = 0
    for images_, targets in loader:
        assert isinstance(images_, list)
        for img, t in zip(images_, targets):
            i = int(t["image_id"])
            anns = [a for a in _anns(api, i) if not a["iscrowd"]]
            assert t["masks"].dtype == torch.uint8 and t["masks"].shape == (len(anns), *img.shape[1:])
            assert t["keypoints"].shape == (len(anns), 17, 3) and len(t["boxes"]) == len(anns)
            assert not t["iscrowd"].any()
            for k, a in enumerate(anns):
                np.testing.assert_array_equal(t["masks"][k].numpy(), api.annToMask(a)[:, ::-1])
                kp = np.array(a.get("keypoints", [0] * 51), np.float64).reshape(1, 17, 3)
                np.testing.assert_allclose(t["keypoints"][k:k + 1].numpy(), tv_flip_keypoints(kp, img.shape[2]),
                                           atol=1e-4)
            seen += 1
    assert seen == len(ds)
    images_, targets = next(iter(dsc.Loader(ds, batch_size=2, format="torchvision", keep_crowd=True)))
    assert all(t["iscrowd"].sum() == 1 and len(t["masks"]) == len(t["boxes"]) == 7 for t in targets)


def test_batch_forms_carry_masks_and_keypoints(coco):
    ann, images, out, api = coco
    ds = dsc.open(out)
    padded = ds.get_batch([0, 1], boxes="padded", images="padded")
    lst = ds.get_batch([0, 1], boxes="list")
    assert padded["masks"].shape[:2] == (2, 7) and padded["keypoints"].shape == (2, 7, 17, 3)
    for b in range(2):
        h, w = ds[b]["image"].shape[:2]
        np.testing.assert_array_equal(padded["masks"][b, :, :h, :w].numpy(), ds[b]["masks"].numpy())
        np.testing.assert_array_equal(lst["targets"][b]["masks"].numpy(), ds[b]["masks"].numpy())
        np.testing.assert_array_equal(lst["targets"][b]["keypoints"].numpy(), ds[b]["keypoints"].numpy())
    # torch's DataLoader path: per-sample views of one gather
    items = ds.__getitems__([1, 2])
    np.testing.assert_array_equal(items[1]["masks"].numpy(), ds[2]["masks"].numpy())


def _people(api, image_id):
    return [a for a in _anns(api, image_id) if a["category_id"] == 1 and not a["iscrowd"]]


def test_yolo_segments_and_pose(coco, tmp_path):
    """YOLO segment polygons -> masks equal to pycocotools drawing the same polygon in pixels; a pose set
    (kpt_shape, flip_idx) -> keypoints in pixels with data.yaml's flip permutation; a box line in a segment
    set is refused."""
    from pycocotools import mask as M

    ann, images, out, api = coco
    seg, pose = tmp_path / "seg", tmp_path / "pose"
    for root in (seg, pose):
        (root / "images" / "train").mkdir(parents=True)
        (root / "labels" / "train").mkdir(parents=True)
    for img in api.loadImgs(api.getImgIds()):
        w, h = img["width"], img["height"]
        for root in (seg, pose):
            (root / "images" / "train" / img["file_name"]).write_bytes((images / img["file_name"]).read_bytes())
        people = _people(api, img["id"])
        stem = img["file_name"].rsplit(".", 1)[0]
        (seg / "labels" / "train" / f"{stem}.txt").write_text("".join(
            "0 " + " ".join(repr(v / (w if k % 2 == 0 else h)) for k, v in enumerate(a["segmentation"][0])) + "\n"
            for a in people))
        lines = []
        for a in people:
            x, y, bw, bh = a["bbox"]
            kp = np.array(a["keypoints"], np.float64).reshape(17, 3)
            vals = [(x + bw / 2) / w, (y + bh / 2) / h, bw / w, bh / h] + [
                v for px, py, pv in kp for v in (px / w, py / h, pv)]
            lines.append("0 " + " ".join(repr(float(v)) for v in vals) + "\n")
        (pose / "labels" / "train" / f"{stem}.txt").write_text("".join(lines))
    (seg / "data.yaml").write_text("train: images/train\nnames: [person]\n")
    (pose / "data.yaml").write_text(f"train: images/train\nnames: [person]\nkpt_shape: [17, 3]\n"
                                    f"flip_idx: {FLIP_INDS}\n")
    dsc.compile_yolo(seg, tmp_path / "seg_out", masks="instance", progress=False, workers=1)
    dsc.compile_yolo(pose, tmp_path / "pose_out", progress=False, workers=1)
    ds_seg, ds_pose = dsc.open(tmp_path / "seg_out"), dsc.open(tmp_path / "pose_out")
    assert ds_pose.manifest.fields["keypoints"]["flip_index"] == FLIP_INDS
    for i, img in enumerate(api.loadImgs(api.getImgIds())):
        w, h = img["width"], img["height"]
        people = _people(api, img["id"])
        s = ds_seg[i]
        assert len(s["masks"]) == len(people)
        for j, a in enumerate(people):
            side = lambda k: w if k % 2 == 0 else h  # noqa: E731
            poly = [(v / side(k)) * side(k) for k, v in enumerate(a["segmentation"][0])]
            ref = M.decode(M.merge(M.frPyObjects([poly], h, w)))
            np.testing.assert_array_equal(s["masks"][j].numpy(), ref)
            kp = np.array(a["keypoints"], np.float32).reshape(17, 3)
            np.testing.assert_allclose(ds_pose[i]["keypoints"][j].numpy(), kp, atol=1e-4)
    (seg / "labels" / "train" / "00000.txt").write_text("0 0.5 0.5 0.2 0.2\n")
    with pytest.raises(dsc.errors.SourceError, match="needs every object as a polygon"):
        dsc.compile_yolo(seg, tmp_path / "bad", masks="instance", progress=False, workers=1)


def test_voc_segmentation_object(coco, tmp_path):
    """VOC SegmentationObject: object k of the XML is the pixels of value k + 1 (255 the border: nobody's)."""
    ann, images, out, api = coco
    root = tmp_path / "voc"
    for d in ("JPEGImages", "Annotations", "SegmentationObject", "ImageSets/Segmentation"):
        (root / d).mkdir(parents=True)
    ids, refs = [], {}
    for img in api.loadImgs(api.getImgIds()):
        iid = img["file_name"].rsplit(".", 1)[0]
        ids.append(iid)
        Image.open(images / img["file_name"]).convert("RGB").save(root / "JPEGImages" / f"{iid}.jpg")
        anns = [a for a in _anns(api, img["id"]) if not a["iscrowd"]]
        ins = np.zeros((img["height"], img["width"]), np.uint8)
        objs = []
        for k, a in enumerate(anns):
            m = api.annToMask(a).astype(bool)
            ins[m] = k + 1
            x, y, bw, bh = a["bbox"]
            objs.append(f"<object><name>{'person' if a['category_id'] == 1 else 'thing'}</name><bndbox>"
                        f"<xmin>{int(x) + 1}</xmin><ymin>{int(y) + 1}</ymin><xmax>{int(x + bw)}</xmax>"
                        f"<ymax>{int(y + bh)}</ymax></bndbox></object>")
        ins[0, :] = np.where(ins[0, :] == 0, 255, ins[0, :])  # a border row
        Image.fromarray(ins, "L").save(root / "SegmentationObject" / f"{iid}.png")
        refs[iid] = [(ins == k + 1).astype(np.uint8) for k in range(len(anns))]
        (root / "Annotations" / f"{iid}.xml").write_text(
            f"<annotation><filename>{iid}.jpg</filename><size><width>{img['width']}</width><height>"
            f"{img['height']}</height><depth>3</depth></size>{''.join(objs)}</annotation>")
    (root / "ImageSets/Segmentation/train.txt").write_text("\n".join(ids) + "\n")
    dsc.compile_voc(root, tmp_path / "out", split="train", masks="instance", progress=False, workers=1)
    ds = dsc.open(tmp_path / "out")
    assert "mask" not in ds.manifest.fields and ds.manifest.fields["masks"]["kind"] == "object_masks"
    for i, iid in enumerate(ids):
        got = ds[i]["masks"].numpy()
        assert len(got) == len(refs[iid])
        for k, ref in enumerate(refs[iid]):
            np.testing.assert_array_equal(got[k], ref)


def test_python_dataset_targets_with_masks_and_keypoints(tmp_path):
    """dsc.compile(dataset) of torchvision-form targets ("masks" (k, H, W), "keypoints" (k, K, 3)): stored
    per object exactly; the flip permutation from the dataset's keypoint names."""
    rng = np.random.default_rng(0)

    class People:
        keypoint_names = ["nose", "left_eye", "right_eye"]

        def __init__(self):
            self.items = []
            for i in range(5):
                h, w = 30 + i, 40 - i
                masks = rng.random((3, h, w)) < 0.2
                masks[2] = False
                boxes = torch.tensor([[1.0, 1.0, w - 1.0, h - 1.0]] * 3)
                kps = torch.tensor(rng.uniform(1, 20, (3, 3, 3)), dtype=torch.float32)
                kps[..., 2] = torch.tensor([[2.0, 1.0, 0.0]] * 3)
                kps[..., :2] *= (kps[..., 2:] > 0)
                self.items.append((rng.integers(0, 255, (h, w, 3), dtype=np.uint8),
                                   {"boxes": boxes, "labels": torch.tensor([0, 1, 0]),
                                    "masks": torch.from_numpy(masks.astype(np.uint8)), "keypoints": kps}))

        def __len__(self):
            return len(self.items)

        def __getitem__(self, i):
            return self.items[i]

    data = People()
    dsc.compile(data, tmp_path / "out", classes=["a", "b"], progress=False, workers=1)
    ds = dsc.open(tmp_path / "out")
    assert ds.manifest.fields["keypoints"]["flip_index"] == [0, 2, 1]
    for i in range(len(data)):
        np.testing.assert_array_equal(ds[i]["masks"].numpy(), data[i][1]["masks"].numpy())
        np.testing.assert_allclose(ds[i]["keypoints"].numpy(), data[i][1]["keypoints"].numpy(), atol=1e-6)


def test_verify_info_view_update_and_preview(coco, tmp_path):
    """verify finds a forged mask crop and visible keypoints outside their image; dsc info names the joints;
    the plain-Zarr view holds the new arrays; --update re-places a re-annotated image's masks and joints and
    carries the others; preview draws the masks and the skeleton."""
    import shutil

    import zarr
    from click.testing import CliRunner

    from damage import write_node
    from dsc.cli import main
    from dsc.runtime.preview import preview

    ann, images, out, api = coco
    work = tmp_path / "ds"
    shutil.copytree(out, work)
    assert dsc.verify(work).ok
    info = CliRunner().invoke(main, ["info", str(work)])
    assert info.exit_code == 0 and "left_shoulder" in info.output and "one binary mask per box" in info.output
    g = zarr.open_group(str(work), mode="r")
    ds = dsc.open(work)
    np.testing.assert_array_equal(g["keypoints/points"][:], ds.readers["keypoints"].points)
    assert g["masks/bits"].shape == (ds.manifest.fields["masks"]["nbytes"],)
    png = preview(ds, tmp_path / "p.png", n=2, cell=96)
    plain = preview(dsc.open(dsc.compile_coco(ann, images, tmp_path / "plain", progress=False,
                                                                  workers=1).path), tmp_path / "q.png", n=2, cell=96)
    assert (np.asarray(Image.open(png)) != np.asarray(Image.open(plain))).any()

    rects = np.array(ds.readers["masks"].rects)
    rects[0, 0] = 10_000  # a crop below its image
    write_node(work, "masks/rects/c/0/0", rects.astype("<i4").tobytes(), record=True)
    pts = np.array(ds.readers["keypoints"].points)
    pts[1, 0] = (1e6, 5, 2)
    write_node(work, "keypoints/points/c/0/0/0", pts.astype("<f4").tobytes(), record=True)
    problems = {p.file: p for p in dsc.verify(work).problems}
    assert "masks/rects" in problems and "keypoints/points" in problems, problems

    src = tmp_path / "src"
    shutil.copytree(ann.parent, src)
    data = json.loads((src / ann.name).read_text())
    first = data["annotations"][0]
    first["segmentation"] = [[2, 2, 12, 2, 12, 12, 2, 12]]
    first["bbox"], first["keypoints"][:3] = [2, 2, 10, 10], [5.5, 6.5, 2]
    (src / ann.name).write_text(json.dumps(data))
    up = tmp_path / "up"
    shutil.copytree(out, up)
    dsc.compile_coco(src / ann.name, src / "images", up, masks="instance,semantic", update=True, progress=False,
                     workers=1)
    new, old, api2 = dsc.open(up), dsc.open(out), pycoco.COCO(str(src / ann.name))
    assert dsc.verify(up).ok and new.version == old.version + 1
    for i in range(len(new)):
        s = new[i]
        for j, a in enumerate(_anns(api2, int(s["image_id"]))):
            np.testing.assert_array_equal(s["masks"][j].numpy(), api2.annToMask(a))
    changed = [new[i] for i in range(len(new)) if int(new[i]["image_id"]) == first["image_id"]][0]
    assert changed["keypoints"][0, 0].tolist() == [5.5, 6.5, 2.0]


def test_an_update_asks_each_field_whether_its_rows_are_placed_at_decode(coco, tmp_path):
    """Per-object masks and joints are placed while decoding (the field kinds say so: ``placed_at_decode``, not a
    list of kind names in the update): an --update of a set with instance masks only (no semantic mask, which
    re-decodes on its own) re-places a re-annotated object's mask and joints."""
    import shutil

    from dsc.formats.fields import FIELD_KINDS

    assert {k for k, cls in FIELD_KINDS.items() if cls.placed_at_decode} == {"object_masks", "keypoints"}
    ann, images, _, _ = coco
    out = tmp_path / "inst"
    base = dsc.compile_coco(ann, images, out, masks="instance", progress=False, workers=1).version
    src = tmp_path / "src"
    shutil.copytree(ann.parent, src)
    data = json.loads((src / ann.name).read_text())
    first = data["annotations"][0]
    first["segmentation"] = [[2, 2, 12, 2, 12, 12, 2, 12]]
    first["bbox"], first["keypoints"][:3] = [2, 2, 10, 10], [5.5, 6.5, 2]
    (src / ann.name).write_text(json.dumps(data))
    dsc.compile_coco(src / ann.name, src / "images", out, masks="instance", update=True, progress=False, workers=1)
    new, api2 = dsc.open(out), pycoco.COCO(str(src / ann.name))
    assert "mask" not in new.schema and new.version == base + 1
    changed = [new[i] for i in range(len(new)) if int(new[i]["image_id"]) == first["image_id"]][0]
    np.testing.assert_array_equal(changed["masks"][0].numpy(), api2.annToMask(first))
    assert changed["keypoints"][0, 0].tolist() == [5.5, 6.5, 2.0]


class Rot90(T.Geometric):
    """A map-only op (no steps: the batched path) that is not axis-aligned: a quarter turn counter-clockwise."""

    def plan(self, sizes, gen):
        B = len(sizes)
        m = torch.zeros((B, 3, 3), dtype=torch.float64)
        w = sizes[:, 1].double()
        m[:, 0, 1], m[:, 0, 2], m[:, 1, 0], m[:, 2, 2] = -1.0, w, 1.0, 1.0  # x_in = w - y_out, y_in = x_out
        return m, sizes.flip(1).clone()


def test_a_map_only_op_that_is_not_axis_aligned_moves_masks_and_keypoints(coco, tmp_path):
    """The batched (grid) path with a general map: masks = np.rot90 of the stored ones, joints rotated, none
    swapped (a rotation is no mirror)."""
    ann, images, out, api = coco
    dsc.compile_coco(ann, images, tmp_path / "sq", masks="instance", size=(40, 40), resize="stretch",
                     progress=False, workers=1)
    ds = dsc.open(tmp_path / "sq")
    batch = T.Compose([Rot90()])(ds.get_batch([0, 1, 2]))
    o = batch["box_offsets"].tolist()
    for b in range(3):
        s = ds[b]
        got = dsc.runtime.batches.object_masks(batch, "masks", b).numpy()
        np.testing.assert_array_equal(got, np.rot90(s["masks"].numpy(), axes=(1, 2)))
        kp = s["keypoints"].double().numpy()
        ref = np.stack([kp[..., 1], 40 - kp[..., 0], kp[..., 2]], -1) * (kp[..., 2:] > 0)
        np.testing.assert_allclose(batch["keypoints"][o[b]:o[b + 1]].numpy(), ref, atol=1e-4)


def test_cli_masks_instance_and_voc_bare_masks_flag(coco, tmp_path):
    from click.testing import CliRunner

    from dsc.cli import main

    ann, images, out, api = coco
    r = CliRunner().invoke(main, ["compile", "coco", "--annotations", str(ann), "--images", str(images),
                                  str(tmp_path / "c"), "--masks", "instance", "-q"])
    assert r.exit_code == 0, r.output
    assert set(dsc.open(tmp_path / "c").manifest.fields) == {"masks", "keypoints"}
    bad = CliRunner().invoke(main, ["compile", "coco", "--annotations", str(ann), "--images", str(images),
                                    str(tmp_path / "d"), "--masks", "instances", "-q"])
    assert bad.exit_code != 0 and "instance" in bad.output


def _nearest_rule(m, w, h):
    """The masks' runtime nearest rule (dsc's transforms, the semantic mask's too), written out: output pixel
    (i, j) takes input pixel (floor((i + .5) H / h), floor((j + .5) W / w))."""
    H, W = m.shape
    ys = np.minimum(np.floor((np.arange(h) + 0.5) * H / h).astype(int), H - 1)
    xs = np.minimum(np.floor((np.arange(w) + 0.5) * W / w).astype(int), W - 1)
    return m[ys][:, xs]


def _letterbox(m):
    out = np.zeros((30, 40), np.uint8)
    out[:, 5:35] = _nearest_rule(m, 30, 30)
    return out


# (op, mask reference of a 40x40 mask, keypoint map (x, y) -> (x', y'), output (w, h), swaps joints)
OPS = {"resize": (T.Resize((30, 20)), lambda m: _nearest_rule(m, 20, 30), lambda x, y: (x / 2, y * 0.75), (20, 30)),
       "center-crop": (T.CenterCrop(30), lambda m: m[5:35, 5:35], lambda x, y: (x - 5, y - 5), (30, 30)),
       "letterbox": (T.Letterbox((30, 40)), _letterbox, lambda x, y: (x * 0.75 + 5, y * 0.75), (40, 30)),
       "vflip": (T.RandomVerticalFlip(1.0), lambda m: m[::-1], lambda x, y: (x, 40 - y), (40, 40))}


@pytest.mark.parametrize("name", list(OPS))
def test_every_loader_op_moves_masks_and_keypoints(coco, tmp_path, name):
    """Resize, CenterCrop, Letterbox, a vertical flip (no joint swap): masks against PIL's nearest on the
    stored masks (IoU >= 0.98 for >= 99% of objects), keypoints to 1e-4 px, outside joints (0, 0, 0)."""
    ann, images, out, api = coco
    sq = tmp_path / "sq"
    dsc.compile_coco(ann, images, sq, masks="instance", size=(40, 40), resize="stretch", progress=False, workers=1)
    ds = dsc.open(sq)
    op, ref_mask_of, ref_xy, (ow, oh) = OPS[name]
    ious = []
    for batch in dsc.Loader(ds, batch_size=3, transforms=[op], num_threads=1):
        o = batch["box_offsets"].tolist()
        for b, i in enumerate(batch["index"].tolist()):
            s = ds[i]
            got = dsc.runtime.batches.object_masks(batch, "masks", b).numpy()
            ref = np.stack([ref_mask_of(m) for m in s["masks"].numpy()])
            assert len(got) == o[b + 1] - o[b]
            if len(got) == len(ref):
                ious += [_iou(g, r) for g, r in zip(got, ref)]
            kp = s["keypoints"].double().numpy()
            x, y = ref_xy(kp[..., 0], kp[..., 1])
            vis = (kp[..., 2] > 0) & (x >= 0) & (x <= ow) & (y >= 0) & (y <= oh)
            ref_kp = np.stack([x, y, kp[..., 2]], -1) * vis[..., None]
            if len(got) == len(ref):
                np.testing.assert_allclose(batch["keypoints"][o[b]:o[b + 1]].numpy(), ref_kp, atol=1e-4)
    ious = np.array(ious)
    assert len(ious) > 20 and (ious >= 0.98).mean() >= 0.99, np.sort(ious)[:5]


def test_parts_round_trip_through_the_resume_journal():
    from dsc.formats.fields import KeypointsField, KeypointsSpec, ObjectMasksField

    rng = np.random.default_rng(1)
    mf, kf = ObjectMasksField(), KeypointsField(KeypointsSpec(num_keypoints=2, flip_index=(1, 0)))
    mp, kp = mf.empty_part(), kf.empty_part()
    masks = rng.random((3, 9, 7)) < 0.3
    masks[1] = False
    mp.add(masks)
    mp.pad(2)
    kp.add(rng.random((3, 2, 3)).astype(np.float32))
    kp.pad(1)
    m2, k2 = mf.load_part(json.loads(json.dumps(mp.to_json()))), kf.load_part(json.loads(json.dumps(kp.to_json())))
    assert m2.bits == mp.bits and all((a == b).all() for a, b in zip(m2.rects, mp.rects))
    assert all((a == b).all() for a, b in zip(k2.points, kp.points)) and len(k2.points) == 2


def test_a_flip_on_mixed_sizes_keeps_each_sample_in_its_form(coco):
    """The size-keeping chain on ragged images, packed and padded: each image mirrored at its own size, the
    padding untouched, the masks and joints with it."""
    ann, images, out, api = coco
    ds = dsc.open(out)
    for form in ("packed", "padded"):
        batch = T.Compose([T.RandomHorizontalFlip(1.0)])(ds.get_batch([0, 1, 2], images=form))
        for b in range(3):
            s = ds[b]
            h, w = s["image"].shape[:2]
            img = (batch["image"][batch["image_offsets"][b]:batch["image_offsets"][b + 1]].view(h, w, 3)
                   if form == "packed" else batch["image"][b, :h, :w])
            np.testing.assert_array_equal(img.numpy(), s["image"].numpy()[:, ::-1])
            np.testing.assert_array_equal(dsc.runtime.batches.object_masks(batch, "masks", b).numpy(),
                                          s["masks"].numpy()[:, :, ::-1])
        if form == "padded":
            assert batch["image"].shape[1:3] == tuple(batch["image_sizes"].max(0).values.tolist())


def _same(a, b) -> None:
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and a.stride() == b.stride()
        assert torch.equal(a, b) if not a.is_floating_point() else torch.equal(a.nan_to_num(7.0), b.nan_to_num(7.0))
    elif isinstance(a, dict):
        assert sorted(a) == sorted(b)
        for k in a:
            _same(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _same(x, y)
    else:
        assert a == b


@pytest.mark.parametrize("fmt", ["dict", "torchvision"])
def test_the_loaders_flip_on_mixed_sizes_writes_each_image_once_in_the_gather(coco, monkeypatch, fmt):
    """A flip-only chain on mixed sizes runs in the Loader's gather: each image is written once, flipped or
    not, from its view of the shard straight into its place in the packed batch (it used to be packed, then
    copied again into a new batch by the transform after the gather); the batches equal that older path's
    (the same draws), masks, joints, boxes and the geometry record with them."""
    from dsc.formats.fields.pixels import PixelsReader
    from dsc.runtime.dataset import Dataset
    from dsc.transforms import resample

    ann, images, out, api = coco
    ds = dsc.open(out)
    writes, after = [], []
    pack, own = PixelsReader.pack, resample._each_own_size

    def counting_pack(self, idx, alloc, reads=None, write=None, dtype=None):
        def counted(k, view, dest):
            writes.append((self.name, int(idx[k])))
            write(k, view, dest)
        return pack(self, idx, alloc, reads, counted if write is not None else None, dtype)

    monkeypatch.setattr(PixelsReader, "pack", counting_pack)
    monkeypatch.setattr(resample, "_each_own_size", lambda *a: (after.append(a[1]), own(*a))[1])

    def epoch(in_gather: bool):
        monkeypatch.setattr(Dataset, "gathers_own_sizes", in_gather)
        loader = dsc.Loader(ds, batch_size=4, order="random", seed=5, num_threads=0, format=fmt,
                            transforms=[T.RandomHorizontalFlip()])
        return list(loader)

    new = epoch(True)
    assert sorted(writes) == sorted((k, i) for k in ("image", "mask") for i in range(len(ds))) and not after
    writes.clear()
    old = epoch(False)
    assert not writes and sorted(after) == ["image", "image", "mask", "mask"]
    _same(new, old)
    flipped = [bool(f) for b in new for f in (b["flipped"] if fmt == "dict" else [t["flipped"] for t in b[1]])]
    assert any(flipped) and not all(flipped)


def test_a_flip_run_in_the_gather_mirrors_each_crop_as_it_is_unpacked(coco, monkeypatch):
    """A flip-only plan given to the gather mirrors each object's mask crop (and its rectangle) while unpacking
    it, so no pass over the crops is left for after the gather (counted: only the identity compaction of a
    dropped box's row runs); the batch equals the plan applied after a plain gather, with a box the plan drops."""
    import dataclasses

    from dsc.transforms import objects
    from dsc.transforms.fused import plan_chain
    from dsc.transforms.resample import apply_plan

    ann, images, out, api = coco
    ds = dsc.open(out)
    idx = [0, 1, 2, 3, 4]
    plan = plan_chain([T.RandomHorizontalFlip()], ds.sample_sizes(idx), batch_generator(0, 0, 1, 0))
    assert 0 < int(plan.hflip.sum()) < len(idx)
    n = int(ds.get_batch(idx)["box_offsets"][-1])
    keep = torch.ones(n, dtype=torch.bool)
    keep[3] = False
    plan = dataclasses.replace(plan, keep=keep)
    moves, flip = [], objects._flip_object_masks
    monkeypatch.setattr(objects, "_flip_object_masks", lambda b, k, maps, *a: (
        moves.append(any(m[0] or m[1] for m in maps)), flip(b, k, maps, *a))[1])
    got = ds.get_batch(idx, geometry=plan)
    assert moves == [False]  # the dropped box's row left out; no crop reversed after the gather
    ref = apply_plan(plan, ds.get_batch(idx), ds.schema)
    assert moves == [False, True] and len(ref["masks_rects"]) == n - 1
    _same({k: v for k, v in got.items() if k != "index"}, {k: v for k, v in ref.items() if k != "index"})


def test_annotations_in_the_raw_frame_turn_with_the_image(tmp_path):
    """An image stored raw with EXIF orientation 6 whose COCO entry declares the raw size: its polygon and
    keypoints are in the raw frame and turn with the image (the boxes' rule)."""
    from dsc.compiler.decode import orient_array

    raw_h, raw_w = 30, 50
    (tmp_path / "images").mkdir()
    im = Image.fromarray(np.random.default_rng(0).integers(0, 255, (raw_h, raw_w, 3), dtype=np.uint8))
    exif = Image.Exif()
    exif[0x0112] = 6
    im.save(tmp_path / "images" / "a.png", exif=exif)
    poly = [5.0, 4.0, 30.0, 6.0, 28.0, 20.0, 8.0, 25.0]
    kp = [10.0, 8.0, 2, 40.0, 3.0, 1] + [0, 0, 0]
    ann = {"images": [{"id": 1, "file_name": "a.png", "width": raw_w, "height": raw_h}],
           "annotations": [{"id": 1, "image_id": 1, "category_id": 1, "iscrowd": 0, "segmentation": [poly],
                            "bbox": [5.0, 4.0, 25.0, 21.0], "area": 1.0, "keypoints": kp}],
           "categories": [{"id": 1, "name": "person", "keypoints": ["nose", "left_eye", "right_eye"]}]}
    (tmp_path / "a.json").write_text(json.dumps(ann))
    dsc.compile_coco(tmp_path / "a.json", tmp_path / "images", tmp_path / "out", masks="instance", progress=False,
                     workers=1)
    s = dsc.open(tmp_path / "out")[0]
    assert s["image"].shape[:2] == (raw_w, raw_h)  # displayed: turned
    api = pycoco.COCO(str(tmp_path / "a.json"))
    np.testing.assert_array_equal(s["masks"][0].numpy(), orient_array(api.annToMask(api.loadAnns(1)[0]), 6))
    # orientation 6 (rotate 90 clockwise): raw (x, y) -> displayed (raw_h - y, x)
    np.testing.assert_allclose(s["keypoints"][0].numpy(), [[raw_h - 8.0, 10.0, 2], [raw_h - 3.0, 40.0, 1], [0, 0, 0]],
                               atol=1e-4)


def test_bad_instance_annotations_are_named_skips(coco, tmp_path):
    """A keypoint list of the wrong length, a segmentation missing, an RLE of another size: each a recorded
    skip naming the annotation (never a traceback, never a silently wrong object)."""
    ann, images, out, api = coco
    data = json.loads(ann.read_text())
    by_image = {}
    for a in data["annotations"]:
        by_image.setdefault(a["image_id"], []).append(a)
    by_image[1][0]["keypoints"] = [1, 2, 2]
    del by_image[2][0]["segmentation"]
    crowd = [a for a in by_image[3] if a["iscrowd"]][0]
    crowd["segmentation"]["size"] = [5, 5]
    crowd["segmentation"]["counts"] = [25]
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    r = dsc.compile_coco(path, images, tmp_path / "out", masks="instance", on_error="skip", progress=False,
                         workers=1)
    reasons = " | ".join(s["reason"] for s in r.skipped)
    assert len(r.skipped) == 3 and r.manifest.num_samples == len(data["images"]) - 3, reasons
    assert "keypoints that are not 17" in reasons and "no usable 'segmentation'" in reasons
    assert "cannot rasterise its mask" in reasons and "RLE is 5x5" in reasons


# ----------------------------------------------------------------------------- review: unknown flip permutations
def _yolo_pose(root, data_yaml: str):
    """A 3-joint YOLO pose set of two 24x32 images, one person each."""
    (root / "images" / "train").mkdir(parents=True)
    (root / "labels" / "train").mkdir(parents=True)
    for k in range(2):
        Image.fromarray(np.full((24, 32, 3), 40 * k, np.uint8)).save(root / "images" / "train" / f"{k}.png")
        (root / "labels" / "train" / f"{k}.txt").write_text("0 0.5 0.5 0.5 0.5 0.3 0.4 2 0.25 0.5 2 0.75 0.5 1\n")
    (root / "data.yaml").write_text("train: images/train\nnames: [person]\nkpt_shape: [3, 3]\n" + data_yaml)


def test_unknown_flip_permutation_is_recorded_warned_and_shown(tmp_path):
    """YOLO pose without flip_idx: the manifest says flip_index null (not a known identity), the compile warns
    naming flip_idx (the CLI shows it), dsc info says so, and a Loader with a horizontal flip warns once;
    with flip_idx it is the given permutation and nobody warns."""
    from click.testing import CliRunner

    from dsc.cli import main

    _yolo_pose(tmp_path / "no", "")
    report = dsc.compile_yolo(tmp_path / "no", tmp_path / "no_out", progress=False, workers=1)
    assert any("flip permutation is unknown" in w and "flip_idx" in w for w in report.warnings), report.warnings
    ds = dsc.open(tmp_path / "no_out")
    assert ds.manifest.fields["keypoints"]["flip_index"] is None
    r = CliRunner().invoke(main, ["compile", "yolo", str(tmp_path / "no"), str(tmp_path / "cli_out")])
    assert r.exit_code == 0 and "flip_idx" in r.output, r.output
    info = CliRunner().invoke(main, ["info", str(tmp_path / "no_out")])
    assert info.exit_code == 0 and "flip permutation unknown" in info.output, info.output
    with pytest.warns(UserWarning, match="no known flip permutation.*flip_idx"):
        loader = dsc.Loader(ds, batch_size=2, transforms=[T.RandomHorizontalFlip(1.0)])
    b = next(iter(loader))  # flipped, joints kept in place (nothing else to do without the permutation)
    np.testing.assert_allclose(b["keypoints"][0, :, 0].numpy(), 32 - np.array([9.6, 8.0, 24.0]), atol=1e-4)
    import warnings as w_
    with w_.catch_warnings():
        w_.simplefilter("error")
        dsc.Loader(ds, batch_size=2, transforms=[T.RandomVerticalFlip(1.0)])  # no horizontal flip: no warning

    _yolo_pose(tmp_path / "yes", "flip_idx: [0, 2, 1]\n")
    report = dsc.compile_yolo(tmp_path / "yes", tmp_path / "yes_out", progress=False, workers=1)
    assert not any("flip" in w for w in report.warnings)
    ds = dsc.open(tmp_path / "yes_out")
    assert ds.manifest.fields["keypoints"]["flip_index"] == [0, 2, 1]
    with w_.catch_warnings():
        w_.simplefilter("error")
        b = next(iter(dsc.Loader(ds, batch_size=2, transforms=[T.RandomHorizontalFlip(1.0)])))
    np.testing.assert_allclose(b["keypoints"][0, :, 0].numpy(), 32 - np.array([9.6, 24.0, 8.0]), atol=1e-4)

    kps = torch.tensor([[[3.0, 4.0, 2.0], [5.0, 6.0, 2.0]]])  # dsc.compile(dataset) with neither names nor flip
    items = [(np.zeros((12, 16, 3), np.uint8), {"boxes": torch.tensor([[1.0, 1.0, 9.0, 9.0]]),
                                                 "labels": torch.tensor([0]), "keypoints": kps})] * 2
    report = dsc.compile(items, tmp_path / "py", classes=["a"], progress=False, workers=1)
    assert any("keypoint_flip_index" in w for w in report.warnings), report.warnings
    assert dsc.open(tmp_path / "py").manifest.fields["keypoints"]["flip_index"] is None


def test_flip_permutation_from_name_conventions_and_the_coco_option(coco, tmp_path):
    """Joint names tell the permutation by left/right, l_/r_, _l/_r, L/R conventions; COCO joints named
    otherwise get flip_index null and a warning naming --keypoint-flip, which gives it (CLI and Python)."""
    from click.testing import CliRunner

    from dsc.cli import main
    from dsc.formats.fields.keypoints import flip_index_from_names

    assert flip_index_from_names(["nose", "Leye", "Reye", "Lear", "Rear"]) == [0, 2, 1, 4, 3]
    assert flip_index_from_names(["nose", "l_eye", "r_eye", "knee_L", "knee_R"]) == [0, 2, 1, 4, 3]
    assert flip_index_from_names(["eyeL", "eyeR", "LeftHand", "RightHand", "lHip", "rHip"]) == [1, 0, 3, 2, 5, 4]
    assert flip_index_from_names(["head", "tail"]) is None and flip_index_from_names(["a"]) == [0]
    ann, images, out, api = coco
    data = json.loads(ann.read_text())
    person = [c for c in data["categories"] if c.get("keypoints")][0]
    names = person["keypoints"]
    person["keypoints"] = [n.replace("left_", "L").replace("right_", "R") for n in names]  # Leye, Reye, ...
    (tmp_path / "L.json").write_text(json.dumps(data))
    dsc.compile_coco(tmp_path / "L.json", images, tmp_path / "L", progress=False, workers=1)
    assert dsc.open(tmp_path / "L").manifest.fields["keypoints"]["flip_index"] == FLIP_INDS
    person["keypoints"] = [f"joint{k}" for k in range(17)]
    (tmp_path / "anon.json").write_text(json.dumps(data))
    report = dsc.compile_coco(tmp_path / "anon.json", images, tmp_path / "anon", progress=False, workers=1)
    assert any("flip permutation is unknown" in w and "--keypoint-flip" in w for w in report.warnings)
    assert dsc.open(tmp_path / "anon").manifest.fields["keypoints"]["flip_index"] is None
    r = CliRunner().invoke(main, ["compile", "coco", "--annotations", str(tmp_path / "anon.json"), "--images",
                                  str(images), str(tmp_path / "given"), "--keypoint-flip", ",".join(map(str, FLIP_INDS))])
    assert r.exit_code == 0 and "unknown" not in r.output, r.output
    assert dsc.open(tmp_path / "given").manifest.fields["keypoints"]["flip_index"] == FLIP_INDS
    with pytest.raises(dsc.errors.SourceError, match="give each of the 17 keypoints"):
        dsc.compile_coco(tmp_path / "anon.json", images, tmp_path / "bad", keypoint_flip="0,1", progress=False)


def test_one_rule_resolves_the_flip_permutation_for_every_source(monkeypatch):
    """``resolve_flip`` decides for COCO, YOLO and ``dsc.compile(dataset)`` alike: the source's own permutation
    (checked), else the names' one, one joint itself, else unknown; each source asks it (counted)."""
    from pathlib import Path
    from types import SimpleNamespace

    from dsc.compiler.sources import coco as coco_src, dataset as dataset_src, yolo as yolo_src
    from dsc.formats.fields.keypoints import resolve_flip

    assert resolve_flip(3, [0, 2, 1], ["a", "b", "c"]) == (0, 2, 1)
    assert resolve_flip(3, None, ["nose", "left_eye", "right_eye"]) == (0, 2, 1)
    assert resolve_flip(3) is None and resolve_flip(3, None, ["a", "b", "c"]) is None and resolve_flip(1) == (0,)
    for bad in ([0, 1], [0, 0, 1], "0,2,1", "021", 5, [0, 2.7, 1], [0, 1.5, 2], ["0", "2.5", "1"], [0, True, 2]):
        with pytest.raises(ValueError, match="each of the 3 keypoints once"):  # (never rounded into joints)
            resolve_flip(3, bad)
    assert resolve_flip(3, [0, 2.0, np.int64(1)]) == resolve_flip(3, ["0", " 2", "1"]) == (0, 2, 1)  # (CLI: digits)
    with pytest.raises(dsc.errors.SourceError, match="--keypoint-flip 5: give each of the 3 keypoints"):
        coco_src._keypoints_spec(Path("a.json"), {"categories": [{"id": 1, "name": "person", "keypoints": ["a", "b", "c"]}],
                                                  "annotations": []}, keypoint_flip=5)
    asked = []

    def spy(*a, **k):
        asked.append(a)
        return resolve_flip(*a, **k)

    for mod in (coco_src, yolo_src, dataset_src):
        monkeypatch.setattr(mod, "resolve_flip", spy)
    names = ["nose", "left_eye", "right_eye"]
    data = {"categories": [{"id": 1, "name": "person", "keypoints": names}], "annotations": []}
    assert coco_src._keypoints_spec(Path("a.json"), data).flip_index == (0, 2, 1)
    assert yolo_src._pose(Path("data.yaml"), {"kpt_shape": [3, 3], "flip_idx": [0, 2, 1]})[0].flip_index == (0, 2, 1)
    assert yolo_src._pose(Path("data.yaml"), {"kpt_shape": [3, 3]})[0].flip_index is None
    source = SimpleNamespace(keypoint_names=names)
    assert dataset_src._keypoints_spec(source, SimpleNamespace(keypoints=np.zeros((1, 3, 3)))).flip_index == (0, 2, 1)
    assert len(asked) == 4
    with pytest.raises(dsc.errors.SourceError, match="keypoint_flip_index"):
        dataset_src._keypoints_spec(SimpleNamespace(keypoint_flip_index=[0, 1, 1]),
                                    SimpleNamespace(keypoints=np.zeros((1, 3, 3))))


def test_short_polygon_parts_draw_as_pycocotools_does(coco, tmp_path):
    """A polygon part of fewer than 3 points draws nothing and an odd last number is dropped, as pycocotools'
    frPoly does (annToMask where it draws: such a part after a full polygon); a first part of 4 numbers, on
    which annToMask raises TypeError (frPyObjects takes the list for boxes), is drawn by the same rule instead
    of failing the image; the compile says so."""
    ann, images, out, api = coco
    data = json.loads(ann.read_text())
    anns = [a for a in data["annotations"] if isinstance(a["segmentation"], list) and not a["iscrowd"]]
    full = anns[0]["segmentation"][0]
    anns[0]["segmentation"] = [full, [10, 10, 30, 10], [3, 3], full[:8] + [99]]  # + a 2-point, 1-point, odd part
    anns[1]["segmentation"] = [[10, 10, 30, 10]]  # annToMask: TypeError
    (tmp_path / "a.json").write_text(json.dumps(data))
    report = dsc.compile_coco(tmp_path / "a.json", images, tmp_path / "out", masks="instance,semantic",
                              progress=False, workers=1)
    assert not report.skipped and any("fewer than 3 points" in w for w in report.warnings), report.warnings
    ref = pycoco.COCO(str(tmp_path / "a.json"))
    with pytest.raises(TypeError):
        ref.annToMask(ref.anns[anns[1]["id"]])
    ds = dsc.open(tmp_path / "out")
    for i in range(len(ds)):
        s = ds[i]
        for j, a in enumerate(_anns(ref, int(s["image_id"]))):
            want = (np.zeros(s["image"].shape[:2], np.uint8) if a["id"] == anns[1]["id"] else ref.annToMask(a))
            np.testing.assert_array_equal(s["masks"][j].numpy(), want)
