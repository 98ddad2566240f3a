"""A compile's fixed cost per shard (issue 34): what a Python dataset's small sample no longer costs, counted,
with the shards byte-identical to what the PIL path stored, and the journal still read as before."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import dsc


class Arrays:
    """Python dataset of uint8 arrays (or whatever ``wrap`` makes of each), shapes and values varied."""

    def __init__(self, n: int, channels=3, wrap=None, seed=0):
        rng = np.random.default_rng(seed)
        shape = (lambda i: (5 + i % 3, 7 - i % 2, channels)) if channels else (lambda i: (5 + i % 3, 7 - i % 2))
        self.images = [rng.integers(0, 256, shape(i), dtype=np.uint8) for i in range(n)]
        self.wrap = wrap or (lambda a: a)

    def __len__(self):
        return len(self.images)

    def __getitem__(self, i):
        return self.wrap(self.images[i]), i % 3


def _shard_files(out: Path) -> dict[str, bytes]:
    """{path: bytes} of every file of the image field (its shards and arrays)."""
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted((out / "image").rglob("*")) if p.is_file()}


@pytest.mark.parametrize("channels,kw", [
    (3, dict(size=6)),  # resized by PIL, then cropped
    (3, dict(size=6, resizer="torch")),
    (3, dict(max_side=6)),  # ragged: each image at its own size (some not resized at all)
    (3, dict(max_side=8, mode="L")),  # an RGB array stored as L: through PIL, as before
    (0, dict(max_side=8, mode="L")),  # an (H, W) array stored as L: as it is
    (0, dict(size=6)),  # an (H, W) array stored as RGB: through PIL
    (4, dict(size=6)),  # RGBA over the background
    (1, dict(max_side=8)),
])
def test_array_images_are_stored_byte_identical_to_the_pil_path(tmp_path, channels, kw):
    """A dataset of uint8 arrays compiles to the same shard bytes as the same images given as PIL images (the
    path every array took before: ``Image.fromarray``, then the PIL image's pixels)."""
    pytest.importorskip("torch") if kw.get("resizer") == "torch" else None
    ds = Arrays(7, channels)
    opts = dict(shard_size=3, progress=False, workers=1, **kw)
    dsc.compile(ds, tmp_path / "arrays", **opts)
    ds.wrap = lambda a: Image.fromarray(a[:, :, 0] if a.ndim == 3 and a.shape[2] == 1 else a)
    dsc.compile(ds, tmp_path / "pil", **opts)
    got, want = _shard_files(tmp_path / "arrays"), _shard_files(tmp_path / "pil")
    assert got.keys() == want.keys() and got, sorted(got)
    assert all(got[k] == want[k] for k in want), [k for k in want if got[k] != want[k]]
    a, b = dsc.open(tmp_path / "arrays"), dsc.open(tmp_path / "pil")
    assert a.labels.tolist() == b.labels.tolist() == [i % 3 for i in range(7)]


def test_a_tensor_image_is_stored_as_its_array(tmp_path):
    torch = pytest.importorskip("torch")
    ds = Arrays(4)
    opts = dict(size=6, shard_size=2, progress=False, workers=1)
    dsc.compile(ds, tmp_path / "arrays", **opts)
    ds.wrap = lambda a: torch.from_numpy(a).permute(2, 0, 1)  # (C, H, W), not contiguous as (H, W, C)
    dsc.compile(ds, tmp_path / "tensors", **opts)
    assert _shard_files(tmp_path / "arrays") == _shard_files(tmp_path / "tensors")


def test_a_reused_buffer_is_copied(tmp_path):
    """A dataset that fills one buffer for every item stores each item's pixels (the array is copied when
    fetched, as Image.fromarray copied it)."""
    buf = np.zeros((4, 4, 3), np.uint8)

    class Reused:
        def __len__(self):
            return 6

        def __getitem__(self, i):
            buf[:] = i * 10
            return buf, 0

    dsc.compile(Reused(), tmp_path / "d", size=4, shard_size=6, progress=False, workers=1)
    d = dsc.open(tmp_path / "d")
    means = [int(np.asarray(d[i]["image"] if isinstance(d[i], dict) else d[i][0]).mean()) for i in range(6)]
    assert means == [i * 10 for i in range(6)], means


def _counted_compile(tmp_path, monkeypatch, n: int) -> dict[str, int]:
    """Image.fromarray and json.dumps calls while a dataset of ``n`` one-sample shards (uint8 (2, 2, 3)
    arrays stored at their size, as bench_scale's simulation) compiles in this process."""
    calls = {"fromarray": 0, "dumps": 0}
    fromarray, dumps = Image.fromarray, json.dumps

    def counted_fromarray(*a, **k):
        calls["fromarray"] += 1
        return fromarray(*a, **k)

    def counted_dumps(*a, **k):
        calls["dumps"] += 1
        return dumps(*a, **k)

    class Tiny:
        def __len__(self):
            return n

        def __getitem__(self, i):
            return np.full((2, 2, 3), i % 251, np.uint8), i % 10

    with monkeypatch.context() as mp:
        mp.setattr(Image, "fromarray", counted_fromarray)
        mp.setattr(json, "dumps", counted_dumps)
        dsc.compile(Tiny(), tmp_path / f"t{n}", size=2, shard_size=1, progress=False, workers=1)
    assert dsc.open(tmp_path / f"t{n}").labels.tolist() == [i % 10 for i in range(n)]
    return calls


def test_a_small_array_shard_makes_no_pil_image_and_no_json_dumps(tmp_path, monkeypatch):
    """Per shard of uint8 arrays in the stored mode: no PIL image made (it was one Image.fromarray a sample, read
    back with np.asarray) and no json.dumps (the journal line was one, sorting every key, a shard)."""
    few = _counted_compile(tmp_path, monkeypatch, 4)
    many = _counted_compile(tmp_path, monkeypatch, 20)
    assert many["fromarray"] == few["fromarray"] == 0, (few, many)
    assert many["dumps"] == few["dumps"], (few, many)  # (a fixed number a compile, none a shard)


def test_a_journal_of_sorted_lines_as_an_older_dsc_wrote_resumes(tmp_path, monkeypatch):
    """The journal's lines are written in a fixed key order now; lines written with sorted keys (dsc before
    this) still resume, every unit kept, none decoded again."""
    C = sys.modules["dsc.compiler.compile"]
    n, out = 6, tmp_path / "d"
    ds = Arrays(n)
    opts = dict(size=6, shard_size=1, progress=False, workers=1)
    with monkeypatch.context() as mp:
        def stop(*a, **k):
            raise KeyboardInterrupt

        mp.setattr(C, "_finalize", stop)
        with pytest.raises(KeyboardInterrupt):
            dsc.compile(ds, out, **opts)
    journals = [p for p in tmp_path.rglob("units.jsonl")]
    assert len(journals) == 1, journals
    lines = journals[0].read_bytes().splitlines()
    assert len(lines) == n and all(not line.startswith(b'{"files"') for line in lines)  # (fixed order: "s" first)
    old = [json.dumps(json.loads(line), sort_keys=True, separators=(",", ":")).encode() for line in lines]
    assert old != lines and all(o.startswith(b'{"files"') for o in old)
    journals[0].write_bytes(b"".join(o + b"\n" for o in old))
    report = dsc.compile(ds, out, resume=True, **opts)
    assert report.resumed_units == n and report.decoded == 0
    ref = tmp_path / "ref"
    dsc.compile(ds, ref, **opts)
    assert _shard_files(out) == _shard_files(ref)
    assert dsc.open(out).labels.tolist() == [i % 3 for i in range(n)]
