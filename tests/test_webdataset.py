"""The WebDataset source: tars compile to the same shards as the same images in a folder (a brace pattern, a
folder of tars, a list file); labels from .cls or a JSON key; a truncated tar and a member that does not
decode are named skips or clear errors; --resume and --update work per tar."""
import io
import shutil
import signal
import tarfile
from pathlib import Path

import pytest
from click.testing import CliRunner

import dsc
from dsc.cli import main
from conftest import DecodeCounter, journal_units, samples, stopped_at_unit
from dsc.compiler.sources.webdataset import expand_braces, split_member
from dsc.errors import ConfigError, SampleError, SourceError
from dsc.synthetic import pack_webdataset, write_imagefolder

OPTS = dict(size=(24, 32), shard_size=7, progress=False, workers=2)


@pytest.fixture(scope="module")
def wds(tmp_path_factory):
    """(an ImageFolder of 3 x 10 JPEGs, the same images as 3 tars of 10 samples, the folder compiled)."""
    root = tmp_path_factory.mktemp("wds")
    folder = root / "folder"
    write_imagefolder(folder, num_classes=3, per_class=10, size_range=(30, 70), seed=7)
    pack_webdataset(folder, root / "tars", per_tar=10)
    ref = root / "ref.dsc"
    dsc.compile_imagefolder(folder, ref, **OPTS)
    return folder, root / "tars", ref


def shard_bytes(out: Path) -> dict:
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted((out / "image" / "c").rglob("*")) if p.is_file()}


def test_members_are_grouped_as_webdataset_does():
    assert split_member("a/b.c.jpg") == ("a/b", "c.jpg")
    assert split_member("000123.JPG") == ("000123", "jpg")
    assert split_member("dir.v2/000123.cls") == ("dir.v2/000123", "cls")
    assert split_member("noext") is None
    assert expand_braces("s3://b/{000..002}.tar") == ["s3://b/000.tar", "s3://b/001.tar", "s3://b/002.tar"]
    assert expand_braces("x/{a,b}-{1..2}.tar") == ["x/a-1.tar", "x/a-2.tar", "x/b-1.tar", "x/b-2.tar"]


def test_tars_compile_to_the_shards_of_the_same_images_in_a_folder(wds, tmp_path):
    folder, tars, ref = wds
    listing = tmp_path / "tars.txt"
    listing.write_text("# the shards\n" + "".join(f"{p}\n" for p in sorted(tars.glob("*.tar"))))
    ref_ds = dsc.open(ref)
    for k, src in enumerate([f"{tars}/{{00000..00002}}.tar", str(tars), str(listing)]):
        out = tmp_path / f"out{k}"
        r = dsc.compile_webdataset(src, out, **OPTS)
        assert r.manifest.num_samples == 30 and not r.skipped, src
        ds = dsc.open(out)
        assert shard_bytes(out) == shard_bytes(ref), src  # the same pixels, in the same shards
        assert ds.keys[:2] == ["00000.tar/class_00_img_00000", "00000.tar/class_00_img_00001"]
        assert ds.get_batch(range(30))["label"].tolist() == ref_ds.get_batch(range(30))["label"].tolist()
        assert list(ds.classes) == ["0", "1", "2"] and ds.manifest.source["tars"] == 3


def test_label_from_a_json_key_no_label_and_class_names(wds, tmp_path):
    _, tars, ref = wds
    want = dsc.open(ref).get_batch(range(30))["label"].tolist()
    r = dsc.compile_webdataset(str(tars), tmp_path / "j", label_key="label", classes=["a", "b", "c"], **OPTS)
    ds = dsc.open(r.path)
    assert ds.get_batch(range(30))["label"].tolist() == want and list(ds.classes) == ["a", "b", "c"]
    res = CliRunner().invoke(main, ["compile", "webdataset", str(tars), str(tmp_path / "n"), "--no-label",
                                            "--size", "24,32", "-q"])
    assert res.exit_code == 0, res.output
    assert dsc.open(tmp_path / "n").manifest.task == "images" and "label" not in dsc.open(tmp_path / "n")[0]
    with pytest.raises(SampleError, match=r"label 2 is not a class index \(0\.\.1\)"):
        dsc.compile_webdataset(str(tars), tmp_path / "two", classes=["a", "b"], **OPTS)


def _rewrite(tar: Path, edit) -> None:
    """Rewrite ``tar`` with ``edit(name, data) -> data | None`` (None drops the member)."""
    with tarfile.open(tar) as tf:
        members = [(m, tf.extractfile(m).read()) for m in tf.getmembers()]
    with tarfile.open(tar, "w", format=tarfile.USTAR_FORMAT) as tf:
        for m, data in members:
            data = edit(m.name, data)
            if data is not None:
                m.size = len(data)
                tf.addfile(m, io.BytesIO(data))


def test_a_truncated_tar_and_a_member_that_does_not_decode(wds, tmp_path):
    _, tars, _ = wds
    src = tmp_path / "tars"
    shutil.copytree(tars, src)
    _rewrite(src / "00001.tar", lambda name, data: b"not a jpeg" if name == "class_01_img_00003.jpg" else
             (None if name == "class_01_img_00005.cls" else data))
    whole = (src / "00002.tar").read_bytes()
    cut = whole.index(b"class_02_img_00006.jpg")  # inside sample 6's image member (its header starts here)
    (src / "00002.tar").write_bytes(whole[:cut + 600])
    with pytest.raises(SampleError) as e:
        dsc.compile_webdataset(str(src), tmp_path / "fail", **OPTS)
    assert "00001.tar" in str(e.value)  # the first bad input, named; nothing published
    assert not (tmp_path / "fail").exists()
    r = dsc.compile_webdataset(str(src), tmp_path / "skip", on_error="skip", **OPTS)
    reasons = {s["key"]: s["reason"] for s in r.skipped}
    assert r.manifest.num_samples == 30 - 1 - 1 - 4  # the bad image, the sample without a label, 6..9 of the cut tar
    assert "no .cls member" in reasons["00001.tar/class_01_img_00005"]
    assert "truncated" in reasons["00002.tar/*"] and "class_02_img_00006" in reasons["00002.tar/*"]
    bad = reasons["00001.tar/class_01_img_00003"]
    assert "00001.tar:class_01_img_00003.jpg" in bad or "cannot" in bad, bad
    keys = dsc.open(r.path).keys
    assert "00002.tar/class_02_img_00005" in keys and "00002.tar/class_02_img_00006" not in keys
    (src / "00000.tar").write_bytes(b"\0" * 100)
    with pytest.raises(SampleError, match="00000.tar: not a readable tar"):
        dsc.compile_webdataset(str(src / "00000.tar"), tmp_path / "nottar", **OPTS)


def test_update_decodes_only_a_changed_and_an_added_tar(wds, tmp_path, monkeypatch):
    folder, tars, _ = wds
    src = tmp_path / "tars"
    shutil.copytree(tars, src)
    out = tmp_path / "out"
    dsc.compile_webdataset(str(src), out, **OPTS)
    more = tmp_path / "more"
    write_imagefolder(more, num_classes=3, per_class=2, size_range=(30, 50), seed=99)
    added = pack_webdataset(more, tmp_path / "more-tars", per_tar=6)[0]
    shutil.copy(added, src / "00003.tar")
    _rewrite(src / "00001.tar", lambda name, data: (None if name.startswith("class_01_img_00009") else data))
    counter = DecodeCounter(monkeypatch, tmp_path)
    r = dsc.compile_webdataset(str(src), out, update=True, **{**OPTS, "workers": 1})
    assert r.committed and r.plan["added"] == 6 and r.plan["removed"] == 1 and r.plan["decoded"] == 6
    assert len(counter.names) == 6 and all("00003.tar:" in n for n in counter.names), counter.names
    fresh = tmp_path / "fresh"
    dsc.compile_webdataset(str(src), fresh, **OPTS)
    assert samples(dsc.open(out)) == samples(dsc.open(fresh))


def test_an_update_with_nothing_changed_commits_nothing_and_a_new_class_still_counts(wds, tmp_path):
    """Classes from the .cls values (no --classes) are known only after decoding: a no-change update compares
    with the base's (it once saw "classes: 3 -> 0" and committed an empty version); a tar with label 3 adds it."""
    _, tars, _ = wds
    src = tmp_path / "tars"
    shutil.copytree(tars, src)
    out = tmp_path / "out"
    dsc.compile_webdataset(str(src), out, **OPTS)
    res = CliRunner().invoke(main, ["compile", "webdataset", str(src), str(out), "--update"])
    assert res.exit_code == 0, res.output
    assert "up to date with its source" in res.output and "classes:" not in res.output, res.output
    assert dsc.open(out).manifest.version["number"] == 0
    more = tmp_path / "more"
    write_imagefolder(more, num_classes=4, per_class=1, size_range=(30, 50), seed=5)
    shutil.copy(pack_webdataset(more, tmp_path / "more-tars", per_tar=4)[0], src / "00003.tar")
    r = dsc.compile_webdataset(str(src), out, update=True, **{**OPTS, "workers": 1})
    assert r.committed and r.plan["added"] == 4
    ds = dsc.open(out)
    assert list(ds.classes) == ["0", "1", "2", "3"] and ds.get_batch(range(30, 34))["label"].tolist() == [0, 1, 2, 3]


def test_resume_keeps_the_finished_units(wds, tmp_path, monkeypatch):
    _, tars, ref = wds
    out = tmp_path / "out"
    argv = ["compile", "webdataset", f"{tars}/{{00000..00002}}.tar", str(out), "--size", "24,32", "--shard-size", "7",
            "--workers", "1", "-q"]
    r = stopped_at_unit(argv, 2, signal.SIGKILL)
    assert r.returncode == -signal.SIGKILL, r.stderr
    kept = journal_units(tmp_path / ".out.dsc-tmp")
    assert len(kept) == 2 and not out.exists()
    counter = DecodeCounter(monkeypatch, tmp_path)
    res = CliRunner().invoke(main, argv + ["--resume"])
    assert res.exit_code == 0, res.output
    assert "resumed: 2 finished shards verified and kept" in res.output
    assert len(counter.names) == 30 - 2 * 7
    assert shard_bytes(out) == shard_bytes(ref)


def test_cli_sources_take_urls_and_name_a_missing_slash(tmp_path):
    res = CliRunner().invoke(main, ["compile", "imagefolder", "s3:/bucket/src", str(tmp_path / "o")])
    assert res.exit_code != 0 and "did you mean s3://bucket/src?" in res.output, res.output
    res = CliRunner().invoke(main, ["compile", "webdataset", "gs:b/x/{0..1}.tar", str(tmp_path / "o")])
    assert res.exit_code != 0 and "did you mean gs://b/x/{0..1}.tar?" in res.output, res.output
    with pytest.raises(ConfigError, match="did you mean s3://b/src"):
        dsc.compile_imagefolder("s3:/b/src", tmp_path / "o")
    with pytest.raises(SourceError, match="no such tar, folder or list file"):
        dsc.compile_webdataset(str(tmp_path / "nothing"), tmp_path / "o")


def _npy(a) -> bytes:
    import numpy as np

    buf = io.BytesIO()
    np.save(buf, a, allow_pickle=True)
    return buf.getvalue()


def _fielded_tars(folder: Path, out: Path) -> list[Path]:
    """The ImageFolder packed with .txt, .json and an .npy member (a float32[3] per sample: its index)."""
    import numpy as np

    tars = pack_webdataset(folder, out, per_tar=5)
    k = 0
    for t in tars:
        with tarfile.open(t) as tf:
            keys = [m.name.rsplit(".", 1)[0] for m in tf.getmembers() if m.name.endswith(".cls")]
        emb = {key: _npy(np.arange(3, dtype=np.float32) + k + j) for j, key in enumerate(keys)}
        k += len(keys)
        with tarfile.open(t) as tf:
            members = [(m, tf.extractfile(m).read()) for m in tf.getmembers()]
        with tarfile.open(t, "w", format=tarfile.USTAR_FORMAT) as tf:
            for m, data in members:
                tf.addfile(m, io.BytesIO(data))
                if m.name.endswith(".txt"):
                    key = m.name[:-4]
                    info = tarfile.TarInfo(key + ".npy")
                    info.size = len(emb[key])
                    tf.addfile(info, io.BytesIO(emb[key]))
    return tars


def test_txt_json_npy_members_are_fields_in_ds_and_loader_batches(tmp_path):
    """The members present besides the image and .cls are kept as fields named by their extension: .txt text,
    .json json, .npy an array (numpy's format); ds[i] and the Loader's batches carry them exactly."""
    import numpy as np
    import torch

    folder = tmp_path / "folder"
    write_imagefolder(folder, num_classes=2, per_class=5, size_range=(30, 50), seed=3)
    _fielded_tars(folder, tmp_path / "tars")
    r = dsc.compile_webdataset(str(tmp_path / "tars"), tmp_path / "out", **OPTS)
    ds = dsc.open(r.path)
    f = ds.manifest.fields
    assert {k: f[k]["kind"] for k in ("txt", "json", "npy")} == {"txt": "text", "json": "json", "npy": "array"}
    assert (f["npy"]["dtype"], f["npy"]["shape"]) == ("float32", [3])
    assert r.manifest.source["members"] == {"json": ".json", "npy": ".npy", "txt": ".txt"}
    for i in range(10):
        s = ds[i]
        c = s["label"]
        assert s["txt"] == f"a picture of class_{c:02d}"
        assert s["json"] == {"label": c, "file": f"img_{i % 5:05d}.jpg"}
        npy = s["npy"].numpy() if hasattr(s["npy"], "numpy") else np.asarray(s["npy"])
        assert npy.dtype == np.float32 and npy.tolist() == [i, i + 1, i + 2]
    batch = next(iter(dsc.Loader(ds, batch_size=10, order="sequential")))
    assert batch["npy"].dtype == torch.float32 and batch["npy"].tolist() == [[i, i + 1, i + 2] for i in range(10)]
    assert batch["txt"] == [ds[i]["txt"] for i in range(10)] and batch["json"] == [ds[i]["json"] for i in range(10)]
    # --member picks and types them; 'none' keeps none
    res = CliRunner().invoke(main, ["compile", "webdataset", str(tmp_path / "tars"), str(tmp_path / "picked"),
                                    "--member", "txt", "--member", "npy:float16[3]", "--size", "24,32", "-q"])
    assert res.exit_code == 0, res.output
    f = dsc.open(tmp_path / "picked").manifest.fields
    assert set(f) == {"txt", "npy"} and f["npy"]["dtype"] == "float16"
    assert "json" not in dsc.open(tmp_path / "picked")[0]
    r = dsc.compile_webdataset(str(tmp_path / "tars"), tmp_path / "none", members=["none"], **OPTS)
    assert not r.manifest.fields and any("members not stored: .json (10 samples), .npy (10 samples), .txt" in w
                                         for w in r.warnings), r.warnings


def test_a_member_no_sample_has_and_contradictory_label_flags_are_refused_up_front(wds, tmp_path):
    """--member foo that no sample has is a wrong name (it was a per-sample error suggesting --on-error skip,
    which would skip everything); --no-label with --label-key contradict each other."""
    _, tars, _ = wds
    runner = CliRunner()
    res = runner.invoke(main, ["compile", "webdataset", str(tars), str(tmp_path / "m"), "--member", "foo:float16",
                               "--size", "24,32", "-q"])
    assert res.exit_code != 0 and "--member foo: no scanned sample has a .foo member" in res.output, res.output
    assert "check the name" in res.output and "on-error" not in res.output and not (tmp_path / "m").exists()
    res = runner.invoke(main, ["compile", "webdataset", str(tars), str(tmp_path / "n"), "--no-label",
                               "--label-key", "x", "--size", "24,32", "-q"])
    assert res.exit_code != 0 and "--no-label and --label-key x contradict each other" in res.output, res.output
    assert not (tmp_path / "n").exists()


def test_a_changed_caption_is_a_changed_sample_in_an_update(wds, tmp_path):
    """The scan reads the .txt members into the records: an --update sees a new caption whose image did not
    change (and stores it, without decoding the image again)."""
    _, tars, _ = wds
    src = tmp_path / "tars"
    shutil.copytree(tars, src)
    out = tmp_path / "out"
    dsc.compile_webdataset(str(src), out, **OPTS)
    _rewrite(src / "00001.tar", lambda name, data: b"a new caption" if name == "class_01_img_00004.txt" else data)
    r = dsc.compile_webdataset(str(src), out, update=True, **OPTS)
    assert r.committed and r.plan["unchanged"] == 29 and r.plan["decoded"] == 0, r.plan
    ds = dsc.open(out)
    assert ds[ds.keys.index("00001.tar/class_01_img_00004")]["txt"] == "a new caption"
    fresh = tmp_path / "fresh"
    dsc.compile_webdataset(str(src), fresh, **OPTS)
    assert samples(dsc.open(out)) == samples(dsc.open(fresh))


def test_a_bad_npy_or_json_member_is_a_named_skip(tmp_path):
    import numpy as np

    folder = tmp_path / "folder"
    write_imagefolder(folder, num_classes=2, per_class=5, size_range=(30, 50), seed=3)
    tars = _fielded_tars(folder, tmp_path / "tars")
    pickled = _npy(np.array([{"a": 1}, None, 3], dtype=object))  # an object array: a pickle, never loaded
    _rewrite(tars[0], lambda name, data: b"{not json" if name == "class_00_img_00001.json" else
             (pickled if name == "class_00_img_00002.npy" else data))
    with pytest.raises(SampleError, match=r"00000.tar.*\.json member is not JSON"):
        dsc.compile_webdataset(str(tmp_path / "tars"), tmp_path / "fail", **OPTS)
    r = dsc.compile_webdataset(str(tmp_path / "tars"), tmp_path / "skip", on_error="skip", **OPTS)
    reasons = {s["key"]: s["reason"] for s in r.skipped}
    assert r.manifest.num_samples == 8
    assert "its .json member is not JSON" in reasons["00000.tar/class_00_img_00001"]
    assert "its .npy member is not a .npy array" in reasons["00000.tar/class_00_img_00002"]
    assert "allow_pickle" in reasons["00000.tar/class_00_img_00002"]


def test_a_compile_takes_each_records_digest_once(tmp_path, monkeypatch):
    """A record's digest (its value fields' hash) feeds the journal's fingerprint and the dataset's fingerprint
    column: taken once a record, not once for each (it cost 0.13-0.15 s per 1,000 captioned images)."""
    import importlib

    from dsc.compiler import journal
    from dsc.compiler.sources import base

    C = importlib.import_module("dsc.compiler.compile")
    folder = tmp_path / "folder"
    write_imagefolder(folder, num_classes=2, per_class=5, size_range=(30, 50), seed=3)
    _fielded_tars(folder, tmp_path / "tars")
    calls = []
    real = base.record_digest

    def counted(r):
        calls.append(r.key)
        return real(r)
    for module in (base, journal, C):
        monkeypatch.setattr(module, "record_digest", counted)
    r = dsc.compile_webdataset(str(tmp_path / "tars"), tmp_path / "out", **{**OPTS, "workers": 1})
    assert r.manifest.num_samples == 10 and sorted(calls) == sorted(dsc.open(r.path).keys)  # each once
    from dsc.formats import layout as L
    from dsc.formats.zarr_v3 import read_plain_array

    ds = dsc.open(r.path)
    fp = read_plain_array(r.path, L.FINGERPRINT)
    assert fp[:, 4].tolist() == [real(rec) for rec in sorted(  # (the column holds each record's own digest)
        dsc.compiler.sources.webdataset.WebDatasetSource(src=str(tmp_path / "tars")).scan().records,
        key=lambda rec: ds.keys.index(rec.key))]
