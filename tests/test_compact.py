"""dsc compact: after several --updates a version's samples are scattered over many shards; a compaction
rewrites them into storage order (a new version, nothing decoded) so that quasi_random batches touch as few
shards as after a fresh compile, with every sample byte for byte the same."""
import shutil
from pathlib import Path

import numpy as np
import pytest
import zarr
from click.testing import CliRunner
from PIL import Image

import dsc
from dsc.cli import main

K = 8


def _put(path: Path, seed: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.random.default_rng(seed).integers(0, 256, (12, 12, 3), dtype=np.uint8)).save(path)


def shards_per_batch(path, **open_kw) -> list[int]:
    """How many shard files each batch of a quasi_random epoch (batch 8, window 2) reads."""
    ds = dsc.open(path, **open_kw)
    loader = dsc.Loader(ds, batch_size=8, order="quasi_random", window=2)
    needs, _, _ = ds.shard_plan(loader.batch_indices())
    return [len(n) for n in needs]


def every_field(path, **open_kw) -> list[tuple]:
    """(key, every field's bytes) of each sample, in the dataset's order."""
    ds = dsc.open(path, **open_kw)
    return [(k, {name: (v.numpy().tobytes() if hasattr(v, "numpy") else repr(v)) for name, v in ds[i].items()})
            for i, k in enumerate(ds.keys)]


def test_compaction_restores_quasi_random_locality_and_keeps_every_sample(tmp_path):
    src, out, fresh = tmp_path / "src", tmp_path / "out", tmp_path / "fresh"
    for i in range(56):
        _put(src / f"c{i % 7}" / f"{i:03d}.png", i)
    opts = dict(size=8, shard_size=K, workers=1, progress=False)
    dsc.compile_imagefolder(src, out, **opts)
    files, rng = sorted(src.rglob("*.png")), np.random.default_rng(0)
    for u in range(6):  # six updates, each changing 1/7 of the samples (the case)
        for j, f in enumerate(rng.choice(len(files), 8, replace=False)):
            _put(files[f], 1000 + 10 * u + j)
        assert dsc.compile_imagefolder(src, out, update=True, **opts).committed
    dsc.compile_imagefolder(src, fresh, **opts)
    scattered, before = shards_per_batch(out), every_field(out)
    assert max(scattered) > max(shards_per_batch(fresh))  # what the compaction is for

    r = dsc.compact(out)
    assert r.committed and r.version == 7 and r.bytes_written > 0
    assert shards_per_batch(out) == shards_per_batch(fresh)  # as few shards per batch as a fresh compile
    assert max(shards_per_batch(out)) <= 2
    assert every_field(out) == before  # ds[i] is the same sample, byte for byte, with the same key
    assert every_field(out, version=6) == before  # the old version stays until vacuumed
    assert dsc.verify(out).ok
    log = dsc.log(out)
    assert log[-1]["operation"] == "compact" and log[-1]["decoded"] == 0
    assert dsc.open(out).manifest.source == dsc.open(out, version=6).manifest.source

    assert not dsc.compact(out).committed  # in storage order already
    again = dsc.compile_imagefolder(src, out, update=True, **opts)  # keys and fingerprints carried over
    assert not again.committed and again.plan["unchanged"] == 56
    dsc.vacuum(out, keep=1, older_than="0")
    assert every_field(out) == before and dsc.verify(out).ok


def test_compaction_of_ragged_detection_with_masks_keeps_every_field(tmp_path):
    from dsc.synthetic import detection_scenes, write_voc_segmentation

    root, out = tmp_path / "src", tmp_path / "out"
    scenes = detection_scenes(14, seed=3)
    write_voc_segmentation(root, scenes[:10])
    opts = dict(split="train", masks=True, max_side=40, shard_size=3, workers=1, progress=False)
    dsc.compile_voc(root, out, **opts)
    shutil.rmtree(root)
    write_voc_segmentation(root, scenes[2:14])  # two removed, four added
    assert dsc.compile_voc(root, out, update=True, **opts).committed
    before, m0 = every_field(out), dsc.open(out).manifest
    assert dsc.open(out).manifest.num_rows != len(before)  # holes: not in storage order

    r = dsc.compact(out)
    assert r.committed
    m = dsc.open(out).manifest
    assert every_field(out) == before
    live = np.flatnonzero(np.asarray(zarr.open_group(str(out), mode="r")["live"][:]))
    assert live[0] % 3 == 0 and np.array_equal(live, np.arange(live[0], live[0] + len(before)))  # one run, no holes
    assert m.objects["num_boxes"] == sum(len(dsc.open(out)[i]["boxes"]) for i in range(len(before)))
    assert m.objects["dropped_boxes"] == m0.objects["dropped_boxes"]
    assert m.fields["mask"]["classes"] == m0.fields["mask"]["classes"]
    assert dsc.verify(out).ok
    assert not dsc.compile_voc(root, out, update=True, **opts).committed


def test_compact_cli(tmp_path):
    src, out = tmp_path / "src", tmp_path / "out"
    for i in range(12):
        _put(src / f"c{i % 2}" / f"{i}.png", i)
    dsc.compile_imagefolder(src, out, size=8, shard_size=4, progress=False)
    r = CliRunner().invoke(main, ["compact", str(out)])
    assert r.exit_code == 0 and "in storage order already; nothing to do" in r.output
    (src / "c0" / "0.png").unlink()
    dsc.compile_imagefolder(src, out, size=8, shard_size=4, update=True, progress=False)
    r = CliRunner().invoke(main, ["compact", str(out)])
    assert r.exit_code == 0, r.output
    assert "version 2 of" in r.output and "11 samples in 3 shards" in r.output and "nothing decoded" in r.output
    r = CliRunner().invoke(main, ["compact", str(tmp_path / "src")])
    assert r.exit_code == 1 and "dsc compile imagefolder" in r.output
    r = CliRunner().invoke(main, ["compact", "s3://bucket/ds"])
    assert r.exit_code == 1 and "not supported yet" in r.output


def test_an_interrupted_compaction_leaves_the_version_it_started_from(tmp_path, monkeypatch):
    from dsc.formats import versions as V

    src, out = tmp_path / "src", tmp_path / "out"
    for i in range(12):
        _put(src / f"c{i % 2}" / f"{i}.png", i)
    dsc.compile_imagefolder(src, out, size=8, shard_size=4, progress=False)
    (src / "c1" / "1.png").unlink()
    dsc.compile_imagefolder(src, out, size=8, shard_size=4, update=True, progress=False)
    before, slots = every_field(out), sorted(p.name for p in (out / "image" / "c").iterdir())

    def killed(*a, **kw):
        raise KeyboardInterrupt  # (a kill between the new shards and the commit)
    monkeypatch.setattr(V, "commit", killed)
    with pytest.raises(KeyboardInterrupt):
        dsc.compact(out)
    monkeypatch.undo()
    assert dsc.open(out).version == 1 and every_field(out) == before and dsc.verify(out).ok
    assert sorted(p.name for p in (out / "image" / "c").iterdir()) == slots  # its new slots are gone
    assert not (out / V.TXN / "2").exists()
    assert dsc.compact(out).committed and every_field(out) == before
