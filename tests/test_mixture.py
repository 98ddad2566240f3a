"""Several datasets in one Loader: proportions, exact once-per-epoch coverage, rank partitions, resume, one source
per batch, fields that must agree, label spaces, read strategies, and a local + S3 mixture."""
import itertools

import numpy as np
import pytest
import torch

import dsc
from dsc import transforms as T
from dsc.runtime.mixture import merge_classes
from dsc.runtime.orders import ORDERS
from dsc.runtime.orders.mixture import mixture_order, source_counts
from dsc.synthetic import write_imagefolder

ORDER_NAMES = list(ORDERS)


@pytest.fixture(scope="module")
def parts(tmp_path_factory):
    """Three small datasets: a (36, 12x10, classes class_00..02), b (20, 12x10, class_00..01, shards of 4),
    r (20, ragged, like b)."""
    root = tmp_path_factory.mktemp("mixture")
    write_imagefolder(root / "a-src", num_classes=3, per_class=12, size_range=(40, 60), seed=1)
    write_imagefolder(root / "b-src", num_classes=2, per_class=10, size_range=(40, 60), seed=2)
    dsc.compile(root / "a-src", root / "a", size=(12, 10), shard_size=5, progress=False)
    dsc.compile(root / "b-src", root / "b", size=(12, 10), shard_size=4, progress=False)
    dsc.compile(root / "b-src", root / "r", shard_size=4, progress=False)
    dsc.compile(root / "b-src", root / "small", size=(8, 8), shard_size=4, progress=False)
    return {k: dsc.open(root / k) for k in ("a", "b", "r", "small")}


def served(loader) -> list[tuple[int, int]]:
    """(source, index) of every sample of one epoch, checking each against its source's own sample."""
    out = []
    srcs = loader.dataset.datasets
    for b in loader:
        for s, i, img, lab in zip(b["source"].tolist(), b["index"].tolist(), b["image"], b["label"]):
            ref = srcs[s][i]
            assert torch.equal(ref["image"], img) and int(ref["label"]) == int(lab), (s, i)
            out.append((s, i))
    return out


# ----------------------------------------------------------------------------- the order, at 100k
def test_proportions_are_exact_over_an_epoch_of_100k_and_within_bounds_per_batch():
    sizes, weights = [60_000, 30_000, 7_000], [0.5, 0.3, 0.2]
    counts = source_counts(sizes, weights, 100_000)
    assert counts.tolist() == [50_000, 30_000, 20_000] and counts.sum() == 100_000
    offsets = np.cumsum([0] + sizes)
    for order in ORDER_NAMES:
        for epoch in range(3):
            ids = mixture_order(sizes, [256] * 3, counts, order, seed=7, epoch=epoch)
            src = np.searchsorted(offsets, ids, "right") - 1
            frac = np.bincount(src, minlength=3) / len(ids)
            assert np.abs(frac - weights).max() <= 0.01 * np.asarray(weights).max(), (order, frac)
            # every batch of 256: random order within 5 binomial sigmas, the others interleaved evenly
            per = np.stack([np.bincount(src[a:a + 256], minlength=3) for a in range(0, len(ids) - 255, 256)])
            sigma = np.sqrt(256 * np.asarray(weights) * (1 - np.asarray(weights)))
            tol = 5 * sigma if order == "random" else np.full(3, 1.0)
            assert (np.abs(per - 256 * np.asarray(weights)) <= tol).all(), order
            # source 2 (7,000 samples asked for 20,000): 2 whole passes and 6,000 more, none a third time
            counts2 = np.bincount(ids[src == 2] - offsets[2], minlength=7_000)
            assert counts2.min() == 2 and counts2.max() == 3 and counts2.sum() == 20_000


def test_counts_per_source():
    assert source_counts([10, 20]).tolist() == [10, 20]  # each sample once
    assert source_counts([10, 20], epoch_size=45).tolist() == [15, 30]  # by size
    assert source_counts([10, 20], [1, 1]).tolist() == [15, 15]  # the sources' total, by weights
    assert source_counts([10, 20], choose=[50, None]).tolist() == [50, 20]  # up-sampled, the other whole
    assert source_counts([10, 20], [1, 3], 100, choose=[None, 5]).tolist() == [95, 5]


def test_draws_with_replacement():
    ids = mixture_order([10, 1000], [4, 4], [500, 10], "random", seed=1, epoch=0, replace=[True, False])
    small = ids[ids < 10]
    assert len(small) == 500 and len(np.unique(small)) == 10
    assert len(np.unique(ids[ids >= 10])) == 10  # a part of the big one, none twice


# ----------------------------------------------------------------------------- the Loader
def test_a_subset_as_a_mixture_source_is_refused_with_what_works(parts):
    """A Subset works for a single-dataset Loader, not as a mixture source: the message says so (it once said
    the mixture took one) and names choose=/weights=."""
    a, b = parts["a"], parts["b"]
    train, _ = torch.utils.data.random_split(a, [30, 6])
    assert len(dsc.Loader(train, batch_size=10)) == 3
    with pytest.raises(dsc.ConfigError, match=r"source 0 is a torch.utils.data.Subset, which only a single-dataset "
                                              r"dsc.Loader\(subset\) takes.*choose=\[n, \.\.\.\] or weights="):
        dsc.Loader([train, b], batch_size=10)
    with pytest.raises(dsc.ConfigError) as e:
        dsc.Loader([a, [1, 2]], batch_size=10)
    assert "got list" in str(e.value) and "Subset of one" not in str(e.value)


@pytest.mark.parametrize("order", ORDER_NAMES)
def test_every_sample_of_every_source_once_per_epoch(parts, order):
    a, b = parts["a"], parts["b"]
    loader = dsc.Loader([a, b], batch_size=8, order=order, seed=3, window=2)
    everything = sorted([(0, i) for i in range(36)] + [(1, i) for i in range(20)])
    first = served(loader)
    assert sorted(first) == everything and len(loader) == 7
    second = served(loader)  # the next epoch, by itself
    assert sorted(second) == everything and loader.epoch == 1
    if order != "sequential":
        assert first != second
    assert any(len(set(s for s, _ in first[k:k + 8])) == 2 for k in range(0, 56, 8))  # batches mix the sources


def test_weights_and_epoch_size_in_the_loader(parts):
    a, b = parts["a"], parts["b"]
    loader = dsc.Loader([a, b], batch_size=10, order="random", weights=[0.25, 0.75], epoch_size=200, seed=1)
    for _ in range(3):
        src = np.concatenate([x["source"].numpy() for x in loader])
        assert np.bincount(src).tolist() == [50, 150]  # b (20 samples) up-sampled 7.5 times
    loader = dsc.Loader([a, b], batch_size=10, choose=[None, 5], order="quasi_random", seed=1)
    got = served(loader)
    assert sum(s == 1 for s, _ in got) == 5 and sorted(i for s, i in got if s == 0) == list(range(36))


@pytest.mark.parametrize("order", ORDER_NAMES)
def test_ranks_split_the_mixture_exactly(parts, order):
    a, b = parts["a"], parts["b"]
    for world_size in (2, 3, 4):
        for tail in ("pad", "drop"):
            loaders = [dsc.Loader([a, b], batch_size=4, order=order, seed=2, rank=r, world_size=world_size,
                                  tail=tail, num_threads=0) for r in range(world_size)]
            got = [served(L) for L in loaders]
            assert len({len(L) for L in loaders}) == 1
            flat = [x for g in got for x in g]
            whole = loaders[0]._whole_order(1)  # epoch 0 was served; the global order, independent of the ranks
            assert len(whole) == 56
            if tail == "drop":
                assert len(flat) == len(set(flat)) == 56 // world_size * world_size
            else:
                assert len(flat) == -(-56 // world_size) * world_size and len(set(flat)) == 56


def test_mid_epoch_resume_of_a_mixture_is_the_uninterrupted_run(parts):
    a, b = parts["a"], parts["b"]
    kw = dict(batch_size=6, order="random", seed=5, weights=[2, 1], epoch_size=60, transforms=[T.RandomHorizontalFlip()])
    want = [(x["source"].tolist(), x["index"].tolist(), x["image"].clone()) for x in dsc.Loader([a, b], **kw)]
    first = dsc.Loader([a, b], **kw)
    it = iter(first)
    got = [(x["source"].tolist(), x["index"].tolist(), x["image"].clone()) for _, x in zip(range(4), it)]
    state = first.state_dict()
    second = dsc.Loader([a, b], **kw)
    second.load_state_dict(state)
    got += [(x["source"].tolist(), x["index"].tolist(), x["image"].clone()) for x in second]
    assert [g[:2] for g in got] == [w[:2] for w in want]
    assert all(torch.equal(g[2], w[2]) for g, w in zip(got, want))
    with pytest.raises(dsc.ConfigError, match="cannot resume: the saved state is of another mixture: its sources "
                                              "are in another order"):
        dsc.Loader([b, a], **kw).load_state_dict(state)  # another mixture's state
    with pytest.raises(dsc.ConfigError, match="cannot resume: the saved state is of another mixture: weights="):
        dsc.Loader([a, b], **{**kw, "weights": [1, 1]}).load_state_dict(state)
    with pytest.raises(dsc.ConfigError, match="the saved state is of a mixture of 2 datasets, this loader reads one"):
        dsc.Loader(a, batch_size=6, order="random", seed=5).load_state_dict(state)


def test_ranks_draw_their_own_augmentations_in_a_mixture(parts):
    a, b = parts["a"], parts["b"]
    chain = [T.RandomResizedCrop((6, 5), scale=(0.3, 1.0)), T.RandomHorizontalFlip()]
    mixture = dsc.Mixture([a, b])
    crops = []
    for rank in range(2):
        loader = dsc.Loader(mixture, batch_size=7, order="random", seed=3, transforms=chain, rank=rank, world_size=2)
        for j, x in enumerate(loader):
            ids = np.asarray([mixture.offsets[s] + i for s, i in zip(x["source"].tolist(), x["index"].tolist())])
            ref = T.Compose(chain)(mixture.get_batch(ids), seed=3, epoch=0, batch_index=j, rank=rank)
            assert torch.equal(ref["image"], x["image"]) and torch.equal(ref["source"], x["source"])
            crops.append(x["image"])
    assert len(loader.sampler) == 28 and len(list(loader.sampler)) == 28


def test_one_source_per_batch(parts):
    a, b = parts["a"], parts["b"]
    everything = sorted([(0, i) for i in range(36)] + [(1, i) for i in range(20)])
    for order in ORDER_NAMES:
        loader = dsc.Loader([a, b], batch_size=8, order=order, one_source_per_batch=True, seed=1)
        batches = list(loader)
        assert all(len(set(x["source"].tolist())) == 1 for x in batches)
        assert sorted((s, i) for x in batches for s, i in zip(x["source"].tolist(), x["index"].tolist())) == everything
        assert len(loader) == len(batches) == 5 + 3  # 36 = 4 x 8 + 4; 20 = 2 x 8 + 4
        # two ranks: as many batches each, disjoint
        ranks = [dsc.Loader([a, b], batch_size=8, order=order, one_source_per_batch=True, seed=1, rank=r,
                            world_size=2, tail="drop") for r in range(2)]
        got = [[(s, i) for x in L for s, i in zip(x["source"].tolist(), x["index"].tolist())] for L in ranks]
        assert len(ranks[0]) == len(ranks[1]) == 4 and not set(got[0]) & set(got[1])
    assert len(loader.sampler) == 56 and sorted(loader.sampler) == list(range(56))  # ids: a's 0-35, b's 36-55
    drop = dsc.Loader([a, b], batch_size=8, one_source_per_batch=True, drop_last=True)
    assert [len(x["index"]) for x in drop] == [8] * 6


def test_fixed_fields_are_gathered_in_one_pass_equal_to_each_sources_own_batch(parts, tmp_path, monkeypatch):
    """Image + label sources: every field is allocated once per batch and each source's reader writes its rows
    straight in (no dataset batch per source, then a join): the same batches, for every read strategy, with a
    source whose indices are not its rows (an update deleted a sample) and labels mapped by name."""
    from dsc.runtime.dataset import Dataset

    write_imagefolder(tmp_path / "src", num_classes=2, per_class=6, size_range=(20, 30), seed=5)
    (tmp_path / "src" / "class_00").rename(tmp_path / "src" / "zebra")
    (tmp_path / "src" / "zebra" / "img_00001.jpg").unlink()
    opts = dict(size=(12, 10), shard_size=4, progress=False)
    dsc.compile_imagefolder(tmp_path / "src", tmp_path / "h", **opts)
    (tmp_path / "src" / "zebra" / "img_00003.jpg").unlink()
    dsc.compile_imagefolder(tmp_path / "src", tmp_path / "h", update=True, **opts)
    a, h = parts["a"], dsc.open(tmp_path / "h")
    assert len(h) == 10 and h.manifest.num_rows > len(h) and h.classes == ["class_01", "zebra"]
    per_source, real = [], Dataset._get_batch
    monkeypatch.setattr(Dataset, "_get_batch",
                        lambda self, *args, **kw: per_source.append(1) or real(self, *args, **kw))
    for read in ("mapped", "windowed", "direct"):
        batches = {}
        for one_pass in (True, False):
            loader = dsc.Loader([a, h], batch_size=7, order="random", labels="names", read=read, seed=2)
            loader.dataset._all_dense = one_pass
            per_source.clear()
            batches[one_pass] = [{k: v.clone() for k, v in x.items()} for x in loader]
            assert (len(per_source) == 0) == one_pass, read
        assert loader.classes == ["class_00", "class_01", "class_02", "zebra"]
        got = [(s, i) for x in batches[True] for s, i in zip(x["source"].tolist(), x["index"].tolist())]
        assert sorted(got) == sorted([(0, i) for i in range(36)] + [(1, i) for i in range(10)])
        for x, y in zip(batches[True], batches[False]):
            assert list(x) == list(y) and all(torch.equal(x[k], y[k]) for k in x), read
            for k, (s, i) in enumerate(zip(x["source"].tolist(), x["index"].tolist())):
                ref = [a, h][s][i]
                assert torch.equal(ref["image"], x["image"][k])
                assert loader.classes[int(x["label"][k])] == [a, h][s].classes[int(ref["label"])]
    for bad in ([3, 1], [0, 46], [-1, 2]):  # unsorted, past the last source, negative: refused, not wrong rows
        with pytest.raises(dsc.ConfigError, match="sorted and in \\[0, 46\\)"):
            loader.dataset.get_batch(bad)


def test_read_strategies_serve_the_same_mixture(parts):
    a, b, r = parts["a"], parts["b"], parts["r"]
    for srcs, chain in (([a, b], None), ([r, b], [T.Resize((8, 8))])):
        ref = None
        for read in ("mapped", "windowed", "direct"):
            for order in ("random", "quasi_random"):
                loader = dsc.Loader(srcs, batch_size=5, order=order, read=read, seed=4, window=1, transforms=chain)
                got = [{k: v.clone() for k, v in x.items()} for x in loader]
                if order == "random":
                    if ref is None:
                        ref = got
                    assert len(got) == len(ref) and all(
                        torch.equal(x[k], y[k]) for x, y in zip(got, ref) for k in x), (read, order)


def test_ragged_sources_batch_packed_or_padded_and_match_their_samples(parts):
    r = parts["r"]
    for images in ("packed", "padded"):
        for x in dsc.Loader([r, r], batch_size=6, order="random", images=images):
            for k, (s, i) in enumerate(zip(x["source"].tolist(), x["index"].tolist())):
                ref = r[i]["image"]
                if images == "packed":
                    o = x["image_offsets"]
                    img = x["image"][o[k]:o[k + 1]].view(*x["image_shapes"][k].tolist())
                else:
                    h, w = x["image_sizes"][k].tolist()
                    img = x["image"][k, :h, :w]
                    assert (x["image"][k, h:] == 0).all()
                assert torch.equal(img, ref), (images, s, i)


def test_fields_must_agree(parts, tmp_path):
    a, r, small = parts["a"], parts["r"], parts["small"]
    with pytest.raises(dsc.ConfigError, match="field 'image': fixed 12x10 in source 0, ragged in source 1"):
        dsc.Loader([a, r], batch_size=4)
    with pytest.raises(dsc.ConfigError, match="field 'image'"):
        dsc.Loader([a, small], batch_size=4)
    with pytest.raises(dsc.ConfigError, match="field 'image'"):
        dsc.Loader([a, small], batch_size=4, transforms=[T.RandomHorizontalFlip()])  # still two sizes
    loader = dsc.Loader([a, small, r], batch_size=9, transforms=[T.Resize((6, 7))], order="random")
    x = next(iter(loader))
    assert x["image"].shape == (9, 6, 7, 3) and len(set(x["source"].tolist())) > 1
    ref = T.Compose([T.Resize((6, 7))])
    for k, (s, i) in enumerate(zip(x["source"].tolist(), x["index"].tolist())):
        one = ref([a, small, r][s].get_batch([i]))["image"][0]
        assert torch.equal(one, x["image"][k])
    # a detection dataset and a classification one: the fields are named
    from dsc.synthetic import detection_scenes, write_coco
    ann, images = write_coco(tmp_path / "coco", detection_scenes(4, seed=1))
    dsc.compile_coco(ann, images, tmp_path / "det", size=(12, 10), progress=False)
    with pytest.raises(dsc.ConfigError, match="do not agree on field"):
        dsc.Loader([a, dsc.open(tmp_path / "det")], batch_size=4)
    with pytest.raises(dsc.ConfigError, match="weights must be 2"):
        dsc.Loader([a, a], batch_size=4, weights=[1])
    with pytest.raises(dsc.ConfigError, match=r"^weights= is for a mixture \(a list of datasets"):
        dsc.Loader(a, batch_size=4, weights=[1])  # (it said "weights= given with Dataset")
    with pytest.raises(dsc.ConfigError, match=r"^weights= is for a mixture"):
        dsc.Loader(str(tmp_path / "det"), batch_size=4, weights=[1])  # (and "given with str" for a path)
    with pytest.raises(dsc.ConfigError, match="given with a dsc.Mixture, which already says it"):
        dsc.Loader(dsc.Mixture([a, a]), batch_size=4, weights=[1, 1])
    with pytest.raises(dsc.ConfigError, match="indices="):
        dsc.Loader([a, a], batch_size=4, indices=[0])


def test_label_spaces(parts):
    a, b = parts["a"], parts["b"]
    kept = dsc.Loader([b, a], batch_size=56)
    x = next(iter(kept))
    assert kept.classes == [b.classes, a.classes]
    names = dsc.Loader([b, a], batch_size=56, labels="names")
    y = next(iter(names))
    assert names.classes == ["class_00", "class_01", "class_02"]
    for k, (s, i) in enumerate(zip(y["source"].tolist(), y["index"].tolist())):
        own = [b, a][s].classes[int(x["label"][k])]
        assert names.classes[int(y["label"][k])] == own
    merged, tables = merge_classes([["cat", "dog"], ["dog", "bird"]])
    assert merged == ["cat", "dog", "bird"] and tables[1].tolist() == [1, 2]
    with pytest.raises(dsc.ConfigError, match="'Traffic_Light' of source 1 and 'traffic light' of source 0"):
        merge_classes([["traffic light"], ["Traffic_Light"]])
    assert merge_classes([["traffic light"], ["Traffic_Light"]], {"Traffic_Light": "traffic light"})[0] == \
        ["traffic light"]
    with pytest.raises(dsc.ConfigError, match="names two of its classes 'x'"):
        merge_classes([["x", "x"]])


def test_a_mixture_of_a_local_and_an_s3_dataset(parts, s3_server, tmp_path, monkeypatch):
    pytest.importorskip("obstore")
    from object_servers import use_server

    use_server(s3_server, monkeypatch)
    s3_server.bucket("dsc-mix")
    src = tmp_path / "src"
    write_imagefolder(src, num_classes=2, per_class=8, size_range=(40, 60), seed=9)
    url = "s3://dsc-mix/b"
    dsc.compile(src, url, size=(12, 10), shard_size=4, progress=False, cache_dir=str(tmp_path / "stage"))
    dsc.compile(src, tmp_path / "b-local", size=(12, 10), shard_size=4, progress=False)
    local_copy = dsc.open(tmp_path / "b-local")
    remote = dsc.open(url, cache_dir=tmp_path / "cache")
    a = parts["a"]
    for order, read in (("random", "mapped"), ("quasi_random", "windowed"), ("random", "direct")):
        loader = dsc.Loader([a, remote], batch_size=6, order=order, seed=1, weights=[1, 1], epoch_size=40, read=read)
        got = []
        for x in loader:
            for k, (s, i) in enumerate(zip(x["source"].tolist(), x["index"].tolist())):
                ref = (a if s == 0 else local_copy)[i]["image"]
                assert torch.equal(x["image"][k], ref)
                got.append(s)
        assert np.bincount(got).tolist() == [20, 20]
    assert remote.storage.cache.downloads > 0
    # read="auto", the bucket's source with no shard cache: that source alone reads by byte ranges (it used to be
    # refused for its cache limit, the mixture choosing one strategy as if every source were local)
    uncached = dsc.open(url, cache_dir=tmp_path / "cache0", cache_limit=0)
    loader = dsc.Loader([a, uncached], batch_size=6, order="random", seed=1, weights=[1, 1], epoch_size=40)
    assert loader.read_strategy == "mapped+ranged", loader.read_reason
    assert "cache_limit=0" in loader.read_reason and str(a.path) in loader.read_reason
    n = 0
    for x in loader:
        for k, (s, i) in enumerate(zip(x["source"].tolist(), x["index"].tolist())):
            assert torch.equal(x["image"][k], (a if s == 0 else local_copy)[i]["image"])
            n += s
    assert n == 20 and uncached.storage.cache.downloads == 0 and loader._reads[1].requests > 0


def test_a_detection_mixture_keeps_each_sample_its_boxes(tmp_path):
    from dsc.synthetic import detection_scenes, write_coco

    srcs = []
    for k, (n, shard) in enumerate(((6, 2), (5, 3))):
        ann, images = write_coco(tmp_path / f"coco{k}", detection_scenes(n, seed=k + 1))
        dsc.compile_coco(ann, images, tmp_path / f"det{k}", size=(32, 32), progress=False, shard_size=shard)
        srcs.append(dsc.open(tmp_path / f"det{k}"))
    for boxes in ("packed", "padded", "list"):
        seen = 0
        for x in dsc.Loader(srcs, batch_size=4, order="random", boxes=boxes, labels="names"):
            for k, (s, i) in enumerate(zip(x["source"].tolist(), x["index"].tolist())):
                ref = srcs[s][i]
                if boxes == "packed":
                    o = x["box_offsets"]
                    got = x["boxes"][o[k]:o[k + 1]], x["labels"][o[k]:o[k + 1]]
                elif boxes == "padded":
                    m = x["box_mask"][k]
                    got = x["boxes"][k][m], x["labels"][k][m]
                else:
                    got = x["targets"][k]["boxes"], x["targets"][k]["labels"]
                assert torch.equal(got[0], ref["boxes"]) and torch.equal(got[1], ref["labels"]), (boxes, s, i)
                assert int(x["image_id"][k]) == int(ref["image_id"])
                seen += 1
        assert seen == 11
    images, targets = next(iter(dsc.Loader(srcs, batch_size=4, format="torchvision")))
    assert images.shape == (4, 3, 32, 32) and len(targets) == 4


# ----------------------------------------------------------------------------- per-object masks and keypoints
def _coco_variant(ann, out, rename=None, joints=None):
    """A copy of COCO annotations ``ann`` with its classes renamed and/or only the first ``joints`` keypoints."""
    import json

    d = json.loads(ann.read_text())
    for c in d["categories"]:
        c["name"] = (rename or {}).get(c["name"], c["name"])
        if joints and "keypoints" in c:
            c["keypoints"] = c["keypoints"][:joints]
            c["skeleton"] = [e for e in c["skeleton"] if max(e) <= joints]
    if joints:
        for a in d["annotations"]:
            if "keypoints" in a:
                a["keypoints"] = a["keypoints"][:3 * joints]
                a["num_keypoints"] = sum(1 for v in a["keypoints"][2::3] if v)
    out.write_text(json.dumps(d))
    return out


@pytest.fixture(scope="module")
def instances(tmp_path_factory):
    """Two instance-mask + keypoint datasets (6 and 5 images) whose classes are named differently
    (person/thing, human/object), and one like the first with 3 keypoints per box instead of 17."""
    from dsc.synthetic import write_coco_instances

    root = tmp_path_factory.mktemp("instances")
    ann, images = write_coco_instances(root / "src0", n=6, seed=3)
    ann1, images1 = write_coco_instances(root / "src1", n=5, seed=4)
    ann1 = _coco_variant(ann1, root / "renamed.json", rename={"person": "human", "thing": "object"})
    ann3 = _coco_variant(ann, root / "three.json", joints=3)
    for name, (a, im) in {"i0": (ann, images), "i1": (ann1, images1), "k3": (ann3, images)}.items():
        dsc.compile_coco(a, im, root / name, masks="instance", progress=False, workers=1, shard_size=2)
    return [dsc.open(root / n) for n in ("i0", "i1", "k3")]


@pytest.mark.parametrize("form", ["packed", "padded", "list", "torchvision"])
def test_a_mixture_of_instance_mask_datasets_equals_its_sources_sample_by_sample(instances, form):
    """Per-object masks (per object offsets into flat crops, their rects) and keypoints join across sources in
    every batch form; format='torchvision' targets say their source (labels are per source: person vs human)."""
    from dsc.runtime.batches import object_masks

    srcs = instances[:2]
    assert srcs[0].classes != srcs[1].classes
    kw = {"format": "torchvision", "keep_crowd": True} if form == "torchvision" else {"boxes": form}
    loader = dsc.Loader(srcs, batch_size=4, order="random", seed=2, num_threads=0, **kw)
    by_id = [{int(ds[i]["image_id"]): i for i in range(len(ds))} for ds in srcs]
    seen, mixed = [], 0
    for x in loader:
        if form == "torchvision":
            images, targets = x
            pairs = [(t["source"], by_id[t["source"]][t["image_id"]]) for t in targets]
        else:
            pairs = list(zip(x["source"].tolist(), x["index"].tolist()))
        mixed += len({s for s, _ in pairs}) > 1
        for k, (s, i) in enumerate(pairs):
            ref = srcs[s][i]
            n, (h, w) = len(ref["boxes"]), ref["image"].shape[:2]
            if form == "packed":
                o = x["box_offsets"]
                got = {"boxes": x["boxes"][o[k]:o[k + 1]], "labels": x["labels"][o[k]:o[k + 1]],
                       "keypoints": x["keypoints"][o[k]:o[k + 1]], "masks": object_masks(x, "masks", k)}
            elif form == "padded":
                m = x["box_mask"][k]
                assert int(x["box_counts"][k]) == n and not x["masks"][k, n:].any()
                assert not x["masks"][k, :, h:].any() and not x["masks"][k, :, :, w:].any()
                got = {"boxes": x["boxes"][k][m], "labels": x["labels"][k][m], "keypoints": x["keypoints"][k][m],
                       "masks": x["masks"][k, :n, :h, :w]}
            elif form == "list":
                got = x["targets"][k]
            else:
                got = dict(targets[k], labels=targets[k]["labels"] - 1)
                assert loader.classes[s][int(targets[k]["labels"][0])] == \
                    ["__background__", *srcs[s].classes][int(ref["labels"][0]) + 1]
            for key in ("boxes", "labels", "keypoints", "masks"):
                assert torch.equal(got[key].to(ref[key].dtype), ref[key]), (form, key, s, i)
            seen.append((s, i))
    assert sorted(seen) == [(s, i) for s in range(2) for i in range(len(srcs[s]))] and mixed


def test_torchvision_targets_of_a_mixture_say_their_source(parts, instances):
    images, targets = next(iter(dsc.Loader(instances[:2], batch_size=11, format="torchvision", num_threads=0)))
    assert sorted(t["source"] for t in targets) == [0] * 6 + [1] * 5
    images, target = next(iter(dsc.Loader([parts["a"], parts["b"]], batch_size=56, format="torchvision",
                                          num_threads=0)))
    assert set(target) == {"label", "source"} and sorted(target["source"].tolist()) == [0] * 36 + [1] * 20


def test_keypoints_of_another_layout_are_refused_naming_the_field(instances):
    with pytest.raises(dsc.ConfigError, match="do not agree on field 'keypoints': 17 keypoints per box in source "
                                              "0, 3 in source 1"):
        dsc.Loader([instances[0], instances[2]], batch_size=4)


def test_a_state_of_another_mixture_is_refused_saying_what_differs(parts):
    """Not two hashes: which sources, their order, the weights (and the counts they give), labels=,
    one_source_per_batch= (whose epoch counts batches, not samples)."""
    a, b = parts["a"], parts["b"]
    kw = dict(batch_size=4, order="random", seed=1)
    state = dsc.Loader([a, b], weights=[2, 1], epoch_size=60, **kw).state_dict()
    refused = {
        "its sources are in another order \\(the saved run's: .*/a, .*/b; this loader's: .*/b, .*/a\\)":
            dsc.Loader([b, a], weights=[2, 1], epoch_size=60, **kw),
        "weights=\\[2.0, 1.0\\] in the saved run, \\[1.0, 1.0\\] here; so each source gives \\[30, 30\\] samples per "
        "epoch, not \\[40, 20\\]": dsc.Loader([a, b], weights=[1, 1], epoch_size=60, **kw),
        "labels='per_source' in the saved run, 'names' here":
            dsc.Loader([a, b], weights=[2, 1], epoch_size=60, labels="names", **kw),
        "its source 1 was .*/b \\(20 samples, checksum [0-9a-f]{12}\\), this loader's is .*/a \\(36 samples":
            dsc.Loader([a, a], weights=[2, 1], epoch_size=60, **kw),
        "one_source_per_batch=False in the saved run, True here":
            dsc.Loader([a, b], weights=[2, 1], epoch_size=60, one_source_per_batch=True, **kw),
    }
    for why, loader in refused.items():
        with pytest.raises(dsc.ConfigError, match="cannot resume: the saved state is of another mixture: " + why):
            loader.load_state_dict(state)
    dsc.Loader([a, b], weights=[2, 1], epoch_size=60, **kw).load_state_dict(state)  # the same mixture resumes
    chunked = dsc.Loader([a, b], weights=[2, 1], epoch_size=62, one_source_per_batch=True, **kw).state_dict()
    with pytest.raises(dsc.ConfigError, match="counted in whole batches of one source: the saved run's had 17, this "
                                              "loader's has 15 \\(batch_size=4, drop_last=True\\)"):
        dsc.Loader([a, b], weights=[2, 1], epoch_size=62, one_source_per_batch=True, drop_last=True,
                   **kw).load_state_dict(chunked)


def test_geometry_in_the_gather_moves_each_sources_masks_and_keypoints(instances):
    """Each source's share of the batch's geometry (sizes, mirrored samples: keypoints swap left/right) is its
    own rows of the plan: the mixture's samples equal each source's through the same transforms."""
    from dsc.runtime.batches import object_masks

    srcs = instances[:2]
    kw = dict(transforms=[T.Resize((24, 20)), T.RandomHorizontalFlip(p=1.0)], num_threads=0)
    own = []
    for ds in srcs:
        x = next(iter(dsc.Loader(ds, batch_size=len(ds), **kw)))
        o = x["box_offsets"]
        own.append({int(i): (x["keypoints"][o[k]:o[k + 1]], x["boxes"][o[k]:o[k + 1]], object_masks(x, "masks", k))
                    for k, i in enumerate(x["index"].tolist())})
    for x in dsc.Loader(srcs, batch_size=4, order="random", **kw):
        o = x["box_offsets"]
        for k, (s, i) in enumerate(zip(x["source"].tolist(), x["index"].tolist())):
            got = (x["keypoints"][o[k]:o[k + 1]], x["boxes"][o[k]:o[k + 1]], object_masks(x, "masks", k))
            assert all(torch.equal(g, r) for g, r in zip(got, own[s][i])), (s, i)
            assert got[2].shape[1:] == (24, 20)


def test_value_fields_of_other_shapes_or_dtypes_are_refused(tmp_path):
    """Two sources whose array field has another shape (or dtype) are refused naming the field, not joined
    by torch.cat deep in a batch."""
    rng = np.random.default_rng(5)
    imgs = [rng.integers(0, 255, (8, 8, 3), np.uint8) for _ in range(4)]

    def make(name, emb):
        dsc.compile([(im, {"label": 0, "emb": emb}) for im in imgs], tmp_path / name, workers=1, progress=False)
        return dsc.open(tmp_path / name)

    a = make("a", np.zeros(4, np.float32))
    b = make("b", np.zeros(8, np.float32))
    c = make("c", np.zeros(4, np.float16))
    same = make("d", np.ones(4, np.float32))
    with pytest.raises(dsc.ConfigError, match=r"field 'emb': dtype float32 \(4,\) in source 0, float32 \(8,\) in source 1"):
        dsc.Loader([a, b], batch_size=4)
    with pytest.raises(dsc.ConfigError, match=r"field 'emb': dtype float32 \(4,\) in source 0, float16 \(4,\) in source 1"):
        dsc.Loader([a, c], batch_size=4)
    x = next(iter(dsc.Loader([a, same], batch_size=8, order="sequential")))
    assert x["emb"].shape == (8, 4)


def test_a_source_with_a_field_named_source_is_refused(tmp_path):
    """A mixture's batches give each sample's source under ``source``: a source's own field of that name would
    be overwritten without a word. The mixture refuses it, naming the source and the fix."""
    import numpy as np

    from dsc.errors import ConfigError

    items = [(np.zeros((8, 8, 3), np.uint8), {"label": 0, "source": np.array([70], np.int64)})] * 2
    dsc.compile(items, tmp_path / "a", classes=["a"], progress=False, workers=1)
    with pytest.raises(ConfigError, match="field named 'source'.*renamed"):
        dsc.Loader([dsc.open(tmp_path / "a"), dsc.open(tmp_path / "a")], batch_size=2)
