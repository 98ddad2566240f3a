"""The Loader's CUDA paths, on a machine with a GPU (skipped without one): device batches equal the CPU
dataset over several epochs with slowed copies and a slow consumer (a missing wait or an early slot reuse
shows as a mismatch), every detection batch form, a consumer on its own stream, the transforms on the
device, break / thread failure / resume with copies in flight, memory back to baseline after close(),
reserved memory flat across epochs, set_device honoured, and `dsc bench --device cuda`."""
import gc
import threading

import pytest
import torch

import dsc
from dsc import transforms as T

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


@pytest.fixture(scope="module")
def fixed(scenes_compiled):
    return scenes_compiled(size=(40, 48), resize="stretch", shard_size=4)


@pytest.fixture(scope="module")
def det(tmp_path_factory):
    from dsc.synthetic import detection_scenes, write_coco

    root = tmp_path_factory.mktemp("cudadet")
    ann, images = write_coco(root / "coco", detection_scenes(12, seed=3))
    dsc.compile_coco(ann, images, root / "det", size=64, resize="pad", progress=False)
    return dsc.open(root / "det")


def slow_copies(monkeypatch):
    """Every host-to-device copy starts after a GPU sleep on the copying stream."""
    import dsc.runtime.prefetch as P

    real = P._to_device

    def slowed(batch, device):
        torch.cuda._sleep(2_000_000)
        return real(batch, device)
    monkeypatch.setattr(P, "_to_device", slowed)


def test_device_batches_equal_the_dataset_under_slow_copies_and_a_slow_consumer(fixed, monkeypatch):
    slow_copies(monkeypatch)
    loader = dsc.Loader(fixed, batch_size=5, order="random", device="cuda", prefetch=2, num_threads=2)
    for epoch in range(3):
        loader.set_epoch(epoch)
        for b in loader:
            torch.cuda._sleep(3_000_000)  # the consumer is slow: slots must not be refilled under it
            assert b["image"].device.type == "cuda"
            ref = fixed.get_batch(b["index"].cpu())
            assert torch.equal(b["image"].cpu(), ref["image"]) and torch.equal(b["label"].cpu(), ref["label"])
    loader.close()


@pytest.mark.parametrize("form", ["packed", "padded", "list"])
def test_detection_batch_forms_on_the_device(det, form):
    for b in dsc.Loader(det, batch_size=4, order="random", device="cuda", boxes=form):
        ref = det.get_batch(b["index"].cpu(), boxes=form)
        if form == "list":
            for t, r in zip(b["targets"], ref["targets"]):
                assert torch.equal(t["boxes"].cpu(), r["boxes"]) and t["boxes"].device.type == "cuda"
        else:
            for k, v in ref.items():
                assert torch.equal(b[k].cpu(), v), k


def test_a_consumer_on_its_own_stream(fixed, monkeypatch):
    slow_copies(monkeypatch)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        for b in dsc.Loader(fixed, batch_size=6, order="random", device="cuda"):
            x = b["image"].float().sum()  # on the side stream, which waited for the copy
            ref = fixed.get_batch(b["index"].cpu())["image"].float().sum()
            assert float(x) == float(ref)


def test_transforms_on_the_device_equal_the_cpu_ones(fixed):
    chain = [T.RandomResizedCrop(32), T.RandomHorizontalFlip(), T.ToFloat(), T.Normalize(MEAN, STD)]
    cpu = [b["image"] for b in dsc.Loader(fixed, batch_size=6, order="random", seed=1, transforms=chain)]
    gpu = [b["image"] for b in dsc.Loader(fixed, batch_size=6, order="random", seed=1, transforms=chain,
                                          device="cuda")]
    assert all(g.device.type == "cuda" and torch.allclose(g.cpu(), c, atol=1e-5) for g, c in zip(gpu, cpu))


def test_break_failure_and_resume_with_copies_in_flight(fixed, monkeypatch):
    slow_copies(monkeypatch)
    loader = dsc.Loader(fixed, batch_size=3, order="random", device="cuda", prefetch=3)
    for k, _ in enumerate(loader):
        if k == 1:
            break
    loader.set_epoch(1)  # epochs advance by themselves: pin the one compared twice
    full = [b["image"].cpu() for b in loader]  # the ring is kept and reused: still correct
    loader.set_epoch(1)
    it = iter(loader)
    got = [next(it)["image"].cpu() for _ in range(2)]
    state = loader.state_dict()
    del it
    second = dsc.Loader(fixed, batch_size=3, order="random", device="cuda", prefetch=1)
    second.load_state_dict(state)
    got += [b["image"].cpu() for b in second]
    assert all(torch.equal(a, b) for a, b in zip(got, full)) and len(got) == len(full)

    calls = {"n": 0}
    real = fixed.get_batch

    def failing(*a, **k):
        calls["n"] += 1
        if calls["n"] == 3:
            raise OSError("disk on fire")
        return real(*a, **k)
    monkeypatch.setattr(fixed, "get_batch", failing)
    with pytest.raises(OSError, match="disk on fire"):
        for _ in dsc.Loader(fixed, batch_size=3, device="cuda"):
            pass
    assert not [t for t in threading.enumerate() if t.name.startswith("dsc-loader")]


def test_memory_returns_to_baseline_and_reserved_memory_stays_flat(fixed):
    torch.cuda.synchronize()
    gc.collect()
    base = torch.cuda.memory_allocated()
    loader = dsc.Loader(fixed, batch_size=6, order="random", device="cuda")
    reserved = []
    for epoch in range(6):
        loader.set_epoch(epoch)
        for b in loader:
            pass
        del b
        torch.cuda.synchronize()
        reserved.append(torch.cuda.memory_reserved())
    assert reserved[-1] == reserved[1]  # copy streams are made once: no memory stranded per epoch
    loader.close()
    del loader
    gc.collect()
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() == base


def test_events_wait_without_spinning_and_cuda_resolves_the_current_device(fixed):
    loader = dsc.Loader(fixed, batch_size=4, device="cuda")
    assert loader.device == torch.device("cuda", torch.cuda.current_device())


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_set_device_is_honoured(fixed):
    torch.cuda.set_device(1)
    try:
        loader = dsc.Loader(fixed, batch_size=4, device="cuda")
        assert loader.device == torch.device("cuda", 1)
        for b in loader:
            assert b["image"].device == torch.device("cuda", 1)
    finally:
        torch.cuda.set_device(0)


def test_bench_on_the_device(fixed):
    from click.testing import CliRunner

    from dsc.cli import main

    r = CliRunner().invoke(main, ["bench", str(fixed.path), "--device", "cuda", "--batch-size", "8", "--epochs", "1"])
    assert r.exit_code == 0, r.output
    assert "pinned host-to-device copy limit" in r.output and "overlapped" in r.output


def test_a_failing_device_transform_does_not_leave_the_iterator_waiting(fixed):
    def boom(batch, gen=None):
        raise RuntimeError("bad transform")

    it = iter(dsc.Loader(fixed, batch_size=4, device="cuda", transforms=[T.ToFloat(), boom]))
    with pytest.raises(RuntimeError, match="bad transform"):
        next(it)
    with pytest.raises(StopIteration):  # closed, not waiting for the batch it already took
        next(it)


@pytest.mark.parametrize("threads", [0, 2])
def test_torchvision_form_keys_and_num_threads_zero_on_the_device(det, fixed, threads):
    """format="torchvision" and keys= after the copy (uint8 -> float on the device), from filler threads or
    from the calling thread (num_threads=0), equal the CPU loader's."""
    kw = dict(batch_size=4, order="random", seed=1, num_threads=threads, transforms=[T.RandomHorizontalFlip()])
    cpu = dsc.Loader(det, format="torchvision", **kw)
    gpu = dsc.Loader(det, format="torchvision", device="cuda", **kw)
    for (a, ta), (b, tb) in zip(cpu, gpu):
        assert b.device.type == "cuda" and b.dtype == torch.float32 and torch.equal(a, b.cpu())
        for x, y in zip(ta, tb):
            assert y["labels"].device.type == "cuda" and y["image_id"] == x["image_id"]
            assert torch.equal(x["boxes"], y["boxes"].cpu()) and torch.equal(x["labels"], y["labels"].cpu())
    for (a, la), (b, lb) in zip(dsc.Loader(fixed, keys=("image", "label"), **kw),
                                dsc.Loader(fixed, keys=("image", "label"), device="cuda", **kw)):
        assert torch.equal(a, b.cpu()) and torch.equal(la, lb.cpu())


@pytest.mark.parametrize("read", ["mapped", "windowed", "direct"])
@pytest.mark.parametrize("order", ["sequential", "quasi_random", "random"])
def test_every_read_strategy_fills_pinned_slots_and_device_batches_equal_the_dataset(fixed, monkeypatch, read,
                                                                                     order):
    """Windowed and direct reads land in the ring's pinned slots (preadv straight into them), and the copies
    from there to the device never overtake the reads or the consumer."""
    slow_copies(monkeypatch)
    loader = dsc.Loader(fixed, batch_size=5, order=order, device="cuda", read=read, prefetch=2, num_threads=2)
    assert loader.read_strategy == read
    seen = []
    for b in loader:
        torch.cuda._sleep(1_000_000)
        ref = fixed.get_batch(b["index"].cpu())
        assert torch.equal(b["image"].cpu(), ref["image"]) and torch.equal(b["label"].cpu(), ref["label"])
        seen += b["index"].tolist()
        bufs = [t for slot in loader._ring.slots for t in slot.values()]
        assert bufs and all(t.is_pinned() for t in bufs)
    assert sorted(seen) == list(range(len(fixed)))
    loader.close()


def test_torchvision_form_per_box_masks_on_the_device(tmp_path):
    """Detection with a semantic mask: "mask" and "masks" made on the device equal the CPU loader's."""
    from dsc.synthetic import detection_scenes, write_voc_segmentation

    root = write_voc_segmentation(tmp_path / "voc", detection_scenes(6, seed=4))
    dsc.compile_voc(root, tmp_path / "out", split="train", masks=True, size=64, resize="pad", progress=False)
    ds = dsc.open(tmp_path / "out")
    kw = dict(batch_size=3, order="random", seed=1, format="torchvision")
    n = 0
    for (_, ta), (_, tb) in zip(dsc.Loader(ds, **kw), dsc.Loader(ds, device="cuda", **kw)):
        for x, y in zip(ta, tb):
            assert y["masks"].device.type == "cuda" and torch.equal(x["masks"], y["masks"].cpu())
            assert torch.equal(x["mask"], y["mask"].cpu())
            n += len(x["masks"])
    assert n


def test_value_fields_go_to_the_device_with_the_pixels(tmp_path):
    """Numbers, arrays and ragged fields arrive on the device with the pixels, from pinned slots; text, json and
    bytes stay Python lists on the host; every value equals the dataset's over two epochs with slow copies."""
    import numpy as np

    rng = np.random.default_rng(5)
    emb = rng.standard_normal((24, 16)).astype(np.float16)
    data = [(rng.integers(0, 255, (20, 20, 3), np.uint8),
             {"label": i % 3, "score": 0.5 * i, "emb": emb[i], "tags": list(range(i % 4)), "caption": f"c{i}",
              "meta": {"i": i}}) for i in range(24)]
    dsc.compile(data, tmp_path / "f", size=16, progress=False, workers=1)
    ds = dsc.open(tmp_path / "f")
    loader = dsc.Loader(ds, batch_size=5, order="random", device="cuda", prefetch=2)
    for _ in range(2):
        for b in loader:
            assert b["emb"].is_cuda and b["score"].is_cuda and b["tags"].is_cuda and b["image"].is_cuda
            assert isinstance(b["caption"], list) and isinstance(b["meta"], list) and type(b["meta"][0]) is dict
            idx = b["index"].tolist()
            assert torch.equal(b["emb"].cpu(), torch.from_numpy(emb[idx]))
            assert b["score"].cpu().tolist() == [0.5 * i for i in idx]
            off = b["tags_offsets"].cpu().tolist()
            assert [b["tags"][off[k]:off[k + 1]].cpu().tolist() for k in range(len(idx))] == \
                [list(range(i % 4)) for i in idx]
            assert b["caption"] == [f"c{i}" for i in idx] and b["meta"] == [{"i": i} for i in idx]


class _Shift(T.Geometric):
    """A map-only geometric op (a shift by (3, -2)): it runs on the device, after the copy."""

    def plan(self, sizes, gen):
        m = torch.eye(3, dtype=torch.float64).repeat(len(sizes), 1, 1)
        m[:, 0, 2], m[:, 1, 2] = 3.0, -2.0
        return m, sizes.clone()


def test_instance_masks_and_keypoints_on_the_device(tmp_path):
    """Per-object masks and keypoints: device batches (fused crop + flip in the gather, then a map-only op on
    the device) equal the CPU loader's; format="torchvision" targets on the device."""
    from dsc.synthetic import write_coco_instances

    ann, images = write_coco_instances(tmp_path / "src", n=6, seed=3)
    dsc.compile_coco(ann, images, tmp_path / "out", masks="instance", size=(48, 48), resize="stretch",
                     progress=False, workers=1)
    ds = dsc.open(tmp_path / "out")

    ops = [T.RandomResizedCrop(32, scale=(0.2, 1.0)), T.RandomHorizontalFlip(), _Shift()]
    for a, b in zip(dsc.Loader(ds, batch_size=3, transforms=ops, seed=1),
                    dsc.Loader(ds, batch_size=3, transforms=ops, seed=1, device="cuda")):
        for k in ("boxes", "box_offsets", "masks", "masks_rects", "masks_offsets", "keypoints"):
            assert b[k].device.type == "cuda"
            torch.testing.assert_close(b[k].cpu(), a[k], msg=k)
    for images_, targets in dsc.Loader(ds, batch_size=3, format="torchvision", device="cuda",
                                       transforms=[T.RandomHorizontalFlip()]):
        assert all(t["masks"].device.type == "cuda" and t["masks"].shape[1:] == (48, 48) for t in targets)
        assert all(t["keypoints"].shape[1:] == (17, 3) and not t["iscrowd"].any() for t in targets)


def test_packed_mask_bits_on_the_device_become_crops_first(tmp_path):
    """A batch whose masks are the gather's packed bits (format="torchvision" on the CPU leaves them so) handed
    to the torchvision form on the device: turned into crops there first (crops_of_bits), the (k, H, W) masks
    equal the CPU form's, flips and all."""
    import numpy as np

    from dsc.runtime.batches import _target_masks
    from dsc.synthetic import write_coco_instances

    ann, images = write_coco_instances(tmp_path / "src", n=4, seed=3)
    dsc.compile_coco(ann, images, tmp_path / "out", masks="instance", progress=False, workers=1)
    ds = dsc.open(tmp_path / "out")
    idx = np.arange(len(ds))
    sizes = ds.sample_sizes(idx).numpy()
    flips = [(1, k % 2, h, w) for k, (h, w) in enumerate(sizes.tolist())]
    got = ds.readers["masks"].gather(idx, lambda n, shape, dt: np.empty(shape, dt),
                                     {"object_flips": flips, "object_mask_bits": True})
    batch = {k: torch.from_numpy(v) for k, v in got.items()}
    batch.update(box_offsets=torch.from_numpy(ds.readers["masks"].box_offsets[:len(ds) + 1].astype("int64")),
                 image_sizes=torch.from_numpy(sizes))
    cpu = _target_masks(dict(batch), "masks", None)
    dev = _target_masks({k: v.cuda() for k, v in batch.items()}, "masks", None)
    assert len(cpu) == len(dev) == len(ds) and sum(len(m) for m in cpu) > 0
    for a, b in zip(cpu, dev):
        assert b.device.type == "cuda" and torch.equal(b.cpu(), a)


@pytest.mark.parametrize("preset", ["ta_wide", "ra", "augmix", "autoaugment"])
def test_classification_presets_on_the_device_equal_the_cpu_ones(fixed, preset):
    """The photometric / auto-augment ops, erasing and MixUp/CutMix run on the device after the uint8 copy,
    with the same draws as on the CPU: the same labels, images within float rounding (a grey level)."""
    aa = {"autoaugment": "imagenet"}.get(preset, preset)
    ops = T.presets.classification(aa, crop_size=32, random_erase=0.5, mixup=0.2, cutmix=1.0)
    cpu = list(dsc.Loader(fixed, batch_size=8, seed=2, transforms=ops))
    gpu = list(dsc.Loader(fixed, batch_size=8, seed=2, transforms=ops, device="cuda"))
    for a, b in zip(cpu, gpu):
        assert b["image"].is_cuda and torch.allclose(a["label"], b["label"].cpu(), atol=1e-6)
        d = (a["image"] - b["image"].cpu()).abs()
        assert float(d.mean()) < 0.02 and float((d > 0.05).double().mean()) < 0.02


@pytest.mark.parametrize("preset", ["ssd", "multiscale", "lsj"])
def test_detection_presets_on_the_device(det, preset):
    ops = T.presets.detection(preset, size=64)
    cpu = list(dsc.Loader(det, batch_size=4, seed=1, transforms=ops, format="torchvision"))
    gpu = list(dsc.Loader(det, batch_size=4, seed=1, transforms=ops, format="torchvision", device="cuda"))
    for (ia, ta), (ib, tb) in zip(cpu, gpu):
        for x, y in zip(ta, tb):
            assert y["boxes"].is_cuda and torch.allclose(x["boxes"], y["boxes"].cpu(), atol=1e-3)
        for x, y in zip(ia, ib):
            assert y.is_cuda and x.shape == y.shape and float((x - y.cpu()).abs().mean()) < 0.02


def test_yolo_preset_on_the_device(det):
    ops = T.presets.yolo(64)
    b = next(iter(dsc.Loader(det, batch_size=4, seed=1, transforms=ops, device="cuda")))
    assert b["image"].is_cuda and b["image"].shape == (4, 64, 64, 3) and b["boxes"].is_cuda


def test_geometry_record_and_native_size_images_on_the_device(tmp_path):
    """The transforms' record (``affine``, ``flipped``) composed over a stage fused in the host gather and one
    run on the device equals the CPU loader's, on the device; format="torchvision" at native sizes hands
    the device the CPU's float images (channels-last views, as torchvision's PILToTensor + ToDtype) and
    targets carrying the record."""
    from dsc.synthetic import write_coco_instances

    ann, images = write_coco_instances(tmp_path / "src", n=6, seed=3)
    dsc.compile_coco(ann, images, tmp_path / "out", masks="instance", progress=False, workers=1)
    ds = dsc.open(tmp_path / "out")

    ops = [T.RandomResizedCrop(32, scale=(0.5, 1.0)), T.RandomHorizontalFlip(), _Shift()]
    for a, b in zip(dsc.Loader(ds, batch_size=3, transforms=ops, seed=1),
                    dsc.Loader(ds, batch_size=3, transforms=ops, seed=1, device="cuda")):
        for k in ("affine", "flipped"):
            assert b[k].device.type == "cuda"
            torch.testing.assert_close(b[k].cpu(), a[k], msg=k)
    kw = dict(batch_size=3, format="torchvision", transforms=[T.RandomHorizontalFlip()], seed=2)
    for (ci, ct), (gi, gt) in zip(dsc.Loader(ds, **kw), dsc.Loader(ds, device="cuda", **kw)):
        for x, y in zip(ci, gi):
            assert y.device.type == "cuda" and torch.equal(y.cpu(), x) and y.stride() == x.stride()
        for x, y in zip(ct, gt):
            assert torch.equal(y["affine"].cpu(), x["affine"]) and y["flipped"] == x["flipped"]


def test_yolo_mosaic_mixup_masks_and_keypoints_on_the_device(tmp_path):
    """Mosaic (p < 1) with per-object masks and keypoints, RandomAffine bilinear and nearest, YoloMixUp: on
    the device after the uint8 copy, the same objects as on the CPU, images within a grey level or two."""
    from dsc.synthetic import write_coco_instances

    ann, images = write_coco_instances(tmp_path / "src", n=6, seed=3)
    dsc.compile_coco(ann, images, tmp_path / "out", masks="instance", progress=False, workers=1)
    ds = dsc.open(tmp_path / "out")
    for ops in (T.presets.yolo(48, mosaic=0.7, mixup=0.5),
                [T.Mosaic(32), T.RandomAffine(degrees=20, scale=(0.5, 1.5), size=(32, 32))]):
        cpu = list(dsc.Loader(ds, batch_size=3, seed=4, transforms=ops))
        gpu = list(dsc.Loader(ds, batch_size=3, seed=4, transforms=ops, device="cuda"))
        for a, b in zip(cpu, gpu):
            assert b["image"].is_cuda and b["keypoints"].is_cuda and b["masks"].is_cuda
            for k in ("box_offsets", "labels", "masks_rects"):
                assert torch.equal(a[k], b[k].cpu()), k
            torch.testing.assert_close(a["boxes"], b["boxes"].cpu(), atol=1e-3, rtol=0)
            torch.testing.assert_close(a["keypoints"], b["keypoints"].cpu(), atol=1e-3, rtol=0)
            d = (a["image"].int() - b["image"].cpu().int()).abs()
            assert float((d > 2).double().mean()) < 0.01


def test_uint8_hue_and_hsv_kernels_on_the_device_equal_the_cpu():
    """color.hue_integer and hsv_jitter_integer run whole batches on a GPU (no CPU pieces): the hue (integer
    arithmetic) gives the CPU's very numbers, the HSV jitter (float) the same within a grey level, and within a
    grey level of OpenCV's formula."""
    import numpy as np
    from test_recipes_detection import _opencv_hsv_ref

    from dsc.transforms import color as C

    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (3, 3, 37, 45), generator=g).float()
    f = torch.tensor([-0.3, 0.05, 0.49], dtype=torch.float64)
    gains = torch.tensor([[1.01, 0.5, 1.3], [0.99, 1.6, 0.7], [1.0, 1.0, 1.0]], dtype=torch.float64)
    assert torch.equal(C.hue_integer(x.cuda(), f).cpu(), C.hue_integer(x, f))
    on_gpu = C.hsv_jitter_integer(x.cuda(), gains).cpu()
    assert float((on_gpu - C.hsv_jitter_integer(x, gains)).abs().max()) <= 1
    # Float ties round either way on a GPU (an H100 put 0.27% of pixels a level from the CPU's: fused a + b c),
    # so the device's promise is the CPU's: every pixel within a grey level of OpenCV's formula.
    ref = _opencv_hsv_ref(x.double().numpy(), gains.numpy())
    assert float(np.abs(on_gpu.double().numpy() - ref).max()) <= 1


def test_uint8_saturation_hue_and_hsv_in_place_on_the_device_equal_the_cpu():
    """RandomPhotometricDistort's saturation + hue (color.saturation_hue_u8) and RandomHSV.apply_u8 on a uint8
    batch on the GPU: color._by_pieces runs the kernel once on the samples that drew the op (out= the batch
    itself, written back in place), the CPU piece by piece; the same pixels within a grey level (float ties),
    and a sample that drew neither op is untouched."""
    from dsc.transforms import augment as A
    from dsc.transforms import color as C

    g = torch.Generator().manual_seed(1)
    img = torch.randint(0, 256, (4, 29, 33, 3), dtype=torch.uint8, generator=g)
    sat_on = torch.tensor([True, False, True, False])
    hue_on = torch.tensor([True, True, False, False])
    sat = torch.tensor([1.4, 0.7, 0.6, 1.2], dtype=torch.float64)
    hue = torch.tensor([0.04, -0.03, 0.02, 0.01], dtype=torch.float64)
    cpu = C.saturation_hue_u8(img.clone(), sat_on, sat, hue_on, hue)
    dev = img.cuda()
    got = C.saturation_hue_u8(dev, sat_on, sat, hue_on, hue)
    assert got.data_ptr() == dev.data_ptr()
    assert int((got.cpu().int() - cpu.int()).abs().max()) <= 1 and torch.equal(got[3].cpu(), img[3])
    hsv = A.RandomHSV(0.2, 0.7, 0.4)
    p = hsv.params(torch.tensor([[29, 33]]).expand(4, 2), g)
    cpu = hsv.apply_u8(img.clone(), p, None)
    dev = img.cuda()
    got = hsv.apply_u8(dev, p, None)
    assert got.data_ptr() == dev.data_ptr() and int((got.cpu().int() - cpu.int()).abs().max()) <= 1


def test_a_scripted_float_chain_on_the_device_rounds_as_the_eager_ops_after_many_calls():
    """dsc.nogil runs a scripted function's graph unoptimised: a CUDA build's profiling executor would fuse
    ``a * x + b * y + c`` into one nvrtc kernel after a few calls (fused multiply-adds: other roundings)."""
    from dsc.nogil import nogil

    @nogil
    def chain(x: torch.Tensor, y: torch.Tensor, a: float, b: float, c: float) -> torch.Tensor:
        return a * x + b * y + c
    g = torch.Generator().manual_seed(0)
    x, y = (torch.rand(4096, generator=g).mul_(1000).cuda() for _ in range(2))
    want = chain.eager(x, y, 1.1, -0.3, 7.7)
    for _ in range(8):
        got = chain(x, y, 1.1, -0.3, 7.7)
    assert torch.equal(got, want)
