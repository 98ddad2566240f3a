"""Dataset versions: --update decodes only what changed and equals a fresh compile as a set; snapshot
isolation for a reader in another process through update, commit and vacuum; kill -9 during an update;
time travel, tags, restore, vacuum; concurrent updaters; option changes refused; detection re-annotation
without decoding; Delta Lake tables across table versions; the CLI."""
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import dsc
from conftest import DecodeCounter, journal_units, stopped_at_unit, tree_size
from dsc.formats import versions as V

ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([os.getcwd(), *sys.path])}
OPTS = dict(size=8, shard_size=64, progress=False)


def noise_jpeg(path: Path, seed: int, side: int = 16) -> None:
    """A small JPEG whose bytes no other seed gives (an image moved elsewhere is recognised by them)."""
    rng = np.random.default_rng(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(rng.integers(0, 256, (side, side + 4, 3), dtype=np.uint8)).save(path, quality=90)


def make_folder(root: Path, n: int, classes: int = 4, seed0: int = 0) -> list[Path]:
    paths = []
    for i in range(n):
        p = root / f"c{i % classes}" / f"img_{seed0 + i:05d}.jpg"
        noise_jpeg(p, seed0 + i)
        paths.append(p)
    return paths


def compiled(tmp_path: Path, n: int):
    """(source folder of ``n`` images, their paths, version 0 compiled from it)."""
    src, out = tmp_path / "src", tmp_path / "out"
    paths = make_folder(src, n)
    dsc.compile_imagefolder(src, out, workers=1, **OPTS)
    return src, paths, out


def content(path, version=None, tag=None) -> set:
    """(key, pixels, label) of every sample: what 'the same dataset as a set' compares."""
    ds = dsc.open(path, version=version, tag=tag)
    batch = ds.get_batch(range(len(ds)))
    images = batch["image"].numpy()
    labels = batch["label"].tolist() if "label" in batch else [None] * len(ds)
    return {(k, images[i].tobytes(), labels[i]) for i, k in enumerate(ds.keys)}


def shard_stats(out: Path) -> dict:
    return {p: (p.stat().st_ino, p.stat().st_mtime_ns) for p in (out / "image" / "c").rglob("*") if p.is_file()}


@pytest.fixture
def evolving(tmp_path):
    """Version 0 of 2,000 images; then 200 added, 50 deleted, 30 moved to another class folder."""
    src = tmp_path / "src"
    paths = make_folder(src, 2000)
    out = tmp_path / "out"
    r0 = dsc.compile_imagefolder(src, out, workers=2, **OPTS)
    assert r0.version == 0
    rng = random.Random(0)
    picked = rng.sample(paths, 80)
    for p in picked[:50]:
        p.unlink()
    moved = []
    for p in picked[50:]:
        c = int(p.parent.name[1:])
        dst = src / f"c{(c + 1) % 4}" / p.name
        p.rename(dst)
        moved.append(dst)
    added = make_folder(src, 200, seed0=10_000)
    return src, out, {"deleted": picked[:50], "moved": moved, "added": added}


def test_update_decodes_only_new_images_and_equals_a_fresh_compile(evolving, tmp_path, monkeypatch):
    src, out, changes = evolving
    before = shard_stats(out)
    v0 = content(out)
    counter = DecodeCounter(monkeypatch, tmp_path)
    r1 = dsc.compile_imagefolder(src, out, update=True, workers=2, **OPTS)
    assert r1.committed and r1.version == 1
    assert r1.plan == {"added": 200, "removed": 50, "changed": 0, "relabelled": 0, "moved": 30,
                       "unchanged": 1920, "decoded": 200}
    assert sorted(counter.names) == sorted(str(p) for p in changes["added"])  # exactly the new files
    after = shard_stats(out)
    assert all(after[p] == st for p, st in before.items())  # unchanged shards: same inode, same mtime
    fresh = tmp_path / "fresh"
    dsc.compile_imagefolder(src, fresh, workers=2, **OPTS)
    assert content(out) == content(fresh)
    assert content(out, version=0) == v0  # version 0 is still there, unchanged
    assert dsc.verify(out).ok and dsc.verify(out, version=0).ok
    ds = dsc.open(out)
    assert ds.version == 1 and [h["version"] for h in ds.history()] == [0, 1]
    counter.reset()
    again = dsc.compile_imagefolder(src, out, update=True, workers=2, **OPTS)  # nothing changed since
    assert not again.committed and again.version == 1 and counter.names == []
    assert V.versions(V.Root(out)) == [0, 1]


def test_plain_zarr_sees_the_latest_version_with_removed_rows_marked(evolving):
    zarr = pytest.importorskip("zarr")
    src, out, changes = evolving
    dsc.compile_imagefolder(src, out, update=True, workers=2, **OPTS)
    ds = dsc.open(out)
    g = zarr.open_group(str(out), mode="r")
    live = g["live"][:]
    keys = g["keys"][:]
    assert live.dtype == bool and int(live.sum()) == len(ds)
    assert sorted(str(k) for k, l in zip(keys, live) if l) == sorted(ds.keys)
    deleted = {p.relative_to(src).as_posix() for p in changes["deleted"]}
    dead = {str(k) for k, l in zip(keys, live) if not l and str(k)}
    assert deleted <= dead  # removed samples stay in their shards, marked not live
    images = g["image"]
    rows = np.flatnonzero(live)[:5]
    for r in rows:
        assert np.array_equal(images[int(r)], ds.get_batch([int(np.searchsorted(np.flatnonzero(live), r))])["image"][0].numpy())


def test_label_fix_writes_no_pixels(tmp_path, monkeypatch):
    """Re-labelling (an image moved between class folders, same bytes) decodes nothing, writes no shard."""
    src, paths, out = compiled(tmp_path, 40)
    before = shard_stats(out)
    paths[3].rename(src / "c1" / paths[3].name)
    counter = DecodeCounter(monkeypatch, tmp_path)
    r = dsc.compile_imagefolder(src, out, update=True, workers=1, **OPTS)
    assert r.plan["moved"] == 1 and r.plan["decoded"] == 0 and counter.names == [] and r.bytes_written == 0
    assert shard_stats(out) == before
    ds = dsc.open(out)
    i = ds.keys.index(f"c1/{paths[3].name}")
    assert ds.classes[int(ds[i]["label"])] == "c1"


def test_changed_and_touched_files(tmp_path, monkeypatch):
    """A file rewritten with other bytes is decoded again; one only touched (same bytes) is not."""
    src, paths, out = compiled(tmp_path, 20)
    noise_jpeg(paths[0], 999)  # other pixels, same name
    os.utime(paths[1], (time.time() + 100, time.time() + 100))  # same bytes, new mtime
    shutil.copyfile(paths[2], paths[2].with_suffix(".tmp"))
    os.replace(paths[2].with_suffix(".tmp"), paths[2])  # same bytes, new inode
    counter = DecodeCounter(monkeypatch, tmp_path)
    r = dsc.compile_imagefolder(src, out, update=True, workers=1, **OPTS)
    assert r.plan["changed"] == 1 and r.plan["decoded"] == 1 and counter.names == [str(paths[0])]
    fresh = tmp_path / "fresh"
    dsc.compile_imagefolder(src, fresh, workers=1, **OPTS)
    assert content(out) == content(fresh)
    counter.reset()  # the stat cache was refreshed: the touched files are not read again
    assert not dsc.compile_imagefolder(src, out, update=True, workers=1, **OPTS).committed


def test_update_refuses_other_options_and_old_datasets(tmp_path):
    src, _, out = compiled(tmp_path, 10)
    with pytest.raises(dsc.ConfigError, match="size"):
        dsc.compile_imagefolder(src, out, update=True, workers=1, **{**OPTS, "size": 12})
    with pytest.raises(dsc.ConfigError, match="resize"):
        dsc.compile_imagefolder(src, out, update=True, workers=1, resize="pad", **OPTS)
    legacy = tmp_path / "legacy"
    shutil.copytree(out, legacy)
    shutil.rmtree(legacy / "_dsc")
    with pytest.raises(dsc.ConfigError, match="without versions"):
        dsc.compile_imagefolder(src, legacy, update=True, workers=1, **OPTS)


def test_dry_run_changes_nothing(evolving):
    from conftest import tree_bytes

    src, out, _ = evolving
    before = tree_bytes(out)
    r = dsc.compile_imagefolder(src, out, update=True, dry_run=True, workers=1, **OPTS)
    assert r.dry_run and not r.committed and r.plan["added"] == 200 and r.plan["decoded"] == 200
    assert tree_bytes(out) == before


def test_update_of_a_missing_out_is_a_first_compile(tmp_path):
    src = tmp_path / "src"
    make_folder(src, 10)
    r = dsc.compile_imagefolder(src, tmp_path / "out", update=True, workers=1, **OPTS)
    assert r.version == 0 and len(dsc.open(tmp_path / "out")) == 10


# ----------------------------------------------------------------------------- isolation
READER = textwrap.dedent("""
    import hashlib, json, sys, time
    from pathlib import Path
    import dsc
    out, flag, go, result = sys.argv[1:5]
    ds = dsc.open(out, version=0)
    loader = dsc.Loader(ds, batch_size=64, order="random", seed=7, num_threads=2)
    digests = []
    for i, batch in enumerate(loader):
        digests.append(hashlib.sha256(batch["image"].numpy().tobytes() + batch["label"].numpy().tobytes()).hexdigest())
        if i == 2:
            Path(flag).write_text("reading")
            t = time.time()
            while not Path(go).exists() and time.time() - t < 120:
                time.sleep(0.05)
    Path(result).write_text(json.dumps(digests))
""")


def _epoch(out, version=0) -> list[str]:
    import hashlib

    loader = dsc.Loader(dsc.open(out, version=version), batch_size=64, order="random", seed=7, num_threads=2)
    return [hashlib.sha256(b["image"].numpy().tobytes() + b["label"].numpy().tobytes()).hexdigest() for b in loader]


def test_a_reader_of_version_0_keeps_its_bytes_through_update_commit_and_vacuum(evolving, tmp_path):
    src, out, changes = evolving
    # Make version 0 own files no later version needs: a whole shard's images rewritten with other bytes.
    ds0 = dsc.open(out)
    first_shard_keys = ds0.keys[:64]
    for j, k in enumerate(first_shard_keys):
        for p in src.glob(f"*/{Path(k).name}"):  # where it is now (some were moved to another class)
            noise_jpeg(p, 50_000 + j)
    del ds0  # this process's own handle pins version 0 too
    undisturbed = _epoch(out)
    import gc

    gc.collect()
    flag, go, result = tmp_path / "flag", tmp_path / "go", tmp_path / "result.json"
    script = tmp_path / "reader.py"
    script.write_text(READER)
    p = subprocess.Popen([sys.executable, str(script), str(out), str(flag), str(go), str(result)], env=ENV)
    try:
        t = time.time()
        while not flag.exists():
            assert p.poll() is None and time.time() - t < 60, "the reader did not start"
            time.sleep(0.05)
        r = dsc.compile_imagefolder(src, out, update=True, workers=2, **OPTS)
        assert r.committed and r.version == 1
        report = dsc.vacuum(out, keep=1, older_than=0)
        assert report.pinned == [0] and report.removed == []  # open in the reader: kept
        go.write_text("go")
        assert p.wait(120) == 0
    finally:
        p.kill()
    assert json.loads(result.read_text()) == undisturbed
    # the reader is gone: version 0 and the files only it used go
    before = {f for f in out.rglob("*") if f.is_file()}
    report = dsc.vacuum(out, keep=1, older_than=0)
    assert report.removed == [0] and report.files > 0
    after = {f for f in out.rglob("*") if f.is_file()}
    assert before - after and not any("image/c/0/" in f.as_posix() for f in after)  # slot 0: only version 0's
    assert dsc.verify(out).ok
    with pytest.raises(dsc.VersionNotFoundError, match="vacuum"):
        dsc.open(out, version=0)


def test_open_dataset_and_torch_workers_keep_reading_their_version(evolving):
    """A Dataset and torch DataLoader workers (which re-open it) keep version 0 after newer commits."""
    import torch

    src, out, _ = evolving
    ds = dsc.open(out)
    expect = content(out, 0)
    dsc.compile_imagefolder(src, out, update=True, workers=2, **OPTS)
    assert ds.version == 0 and len(ds) == 2000
    dl = torch.utils.data.DataLoader(ds, batch_size=None, sampler=range(0, 2000, 97), num_workers=2,
                                     multiprocessing_context="spawn")
    keys = ds.keys
    got = {(keys[i], s["image"].numpy().tobytes(), int(s["label"])) for i, s in zip(range(0, 2000, 97), dl)}
    assert got <= expect


def test_loader_state_records_the_version(evolving):
    src, out, _ = evolving
    dsc.compile_imagefolder(src, out, update=True, workers=2, **OPTS)
    state = dsc.Loader(dsc.open(out, version=0), batch_size=32, seed=1).state_dict()
    assert state["version"] == 0
    with pytest.raises(dsc.ConfigError, match="version 0 of the dataset.*reads version 1"):
        dsc.Loader(dsc.open(out), batch_size=32, seed=1).load_state_dict(state)
    dsc.Loader(dsc.open(out, version=0), batch_size=32, seed=1).load_state_dict(state)


# ----------------------------------------------------------------------------- crashes and concurrency
def _update_cmd(src, out):
    return [sys.executable, "-m", "dsc.cli", "compile", "imagefolder", str(src), str(out), "--update",
            "--workers", "2", "-q"]


def test_kill_9_during_an_update_leaves_the_previous_version(evolving, tmp_path):
    """SIGKILL at points spread over a whole update (its scan, decoding, staging, commit, view refresh):
    the dataset opens at version 0 (or 1 if the commit happened), and the rerun finishes the same result."""
    src, out, _ = evolving
    v0 = content(out)
    pristine = tmp_path / "pristine"
    shutil.copytree(out, pristine)
    t0 = time.monotonic()
    subprocess.run(_update_cmd(src, out), env=ENV, check=True, capture_output=True)
    whole = time.monotonic() - t0
    expect = content(out)
    seen = set()
    for k in range(11):
        shutil.rmtree(out)
        shutil.copytree(pristine, out)
        p = subprocess.Popen(_update_cmd(src, out), env=ENV, start_new_session=True, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
        if k < 10:
            time.sleep(whole * (0.3 + 0.08 * k) + random.Random(k).uniform(0, 0.05))
        else:  # timed kills may all miss the decoding on a loaded machine: one lands once it has begun
            deadline = time.monotonic() + 5 * whole
            while not (out / V.TXN / "1").exists() and p.poll() is None and time.monotonic() < deadline:
                time.sleep(0.002)
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
        p.wait()
        ds = dsc.open(out)
        seen.add((ds.version, (out / V.TXN / "1").exists()))
        assert content(out, ds.version) == (v0 if ds.version == 0 else expect)
        del ds
        r = subprocess.run(_update_cmd(src, out), env=ENV, capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        assert dsc.open(out).version == 1 and content(out) == expect and content(out, 0) == v0
        assert dsc.verify(out).ok and not (out / V.TXN / "1").exists()
    assert (0, True) in seen  # some kills hit an update in progress (not only before or after it)


def test_two_updaters_one_commits_the_other_is_told(evolving, tmp_path):
    from dsc.compiler.staging import OutLock

    src, out, _ = evolving
    with OutLock(out, "a test holding the lock"):
        with pytest.raises(dsc.CompileLockedError, match="a test holding the lock"):
            dsc.compile_imagefolder(src, out, update=True, workers=1, **OPTS)
    # Without the lock (a file system whose locks do not work): the log's put-if-absent still picks one.
    rec = V.read_record(V.Root(out), 0)
    one = V.record_json(1, 0, "update", {"samples": 1}, rec["next_slot"], rec["manifest"])
    one["manifest"]["version"] = {"number": 1, "parent": 0, "operation": "update"}
    V.commit(out, one)
    with pytest.raises(dsc.VersionConflictError, match="committed version 1 first"):
        V.commit(out, one)


def test_concurrent_update_processes(evolving, tmp_path):
    src, out, _ = evolving
    procs = [subprocess.Popen(_update_cmd(src, out), env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(2)]
    results = [(p.wait(120), p.stderr.read()) for p in procs]
    codes = sorted(c for c, _ in results)
    assert codes[0] == 0
    if codes[1] != 0:  # the other found the lock taken, and says by whom
        assert any("another dsc" in err or "is locked" in err for c, err in results if c)
    assert V.versions(V.Root(out)) == [0, 1] and dsc.verify(out).ok


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL], ids=["ctrl-c", "kill-9"])
def test_an_interrupted_update_resumes_keeping_its_finished_shards(tmp_path, monkeypatch, sig):
    """Ctrl-C or kill -9 once 2 of an update's 6 new units are journaled: the next update keeps those 2
    (reported) and decodes only the 32 inputs of the other 4, counted in every worker; the version equals an
    uninterrupted update's."""
    from click.testing import CliRunner

    from dsc.cli import main

    src, out, ref = tmp_path / "src", tmp_path / "out", tmp_path / "ref"
    make_folder(src, 40)
    dsc.compile_imagefolder(src, out, size=8, shard_size=8, workers=1, progress=False)
    added = {str(p) for p in make_folder(src, 48, seed0=1000)}
    shutil.copytree(out, ref)
    dsc.compile_imagefolder(src, ref, update=True, workers=2, progress=False)  # uninterrupted
    argv = ["compile", "imagefolder", src, out, "--update", "--workers", "2", "-q"]
    r = stopped_at_unit(argv, 2, sig)
    assert r.returncode == (130 if sig == signal.SIGINT else -signal.SIGKILL), r.stderr
    assert "Traceback" not in r.stderr
    assert len(journal_units(out / V.TXN / "1")) == 2 and dsc.open(out).version == 0
    counter = DecodeCounter(monkeypatch, tmp_path)
    res = CliRunner().invoke(main, [str(a) for a in argv])
    assert res.exit_code == 0, res.output
    assert len(counter.names) == 32 and len(set(counter.names)) == 32 and set(counter.names) <= added
    assert "resuming an interrupted update: 2 of 6 new shards kept" in res.output
    assert "resumed: 2 finished shards verified and kept" in res.output
    assert "decoded 32 in" in res.output and "in 4 new shards (and kept 2 from the interrupted run)" in res.output
    assert dsc.open(out).version == 1 and content(out) == content(ref) and dsc.verify(out).ok


# ----------------------------------------------------------------------------- history
def test_time_travel_tags_restore_vacuum(tmp_path):
    src, paths, out = compiled(tmp_path, 30)
    c0 = content(out)
    for p in paths[:10]:
        p.unlink()
    dsc.compile_imagefolder(src, out, update=True, workers=1, **OPTS)
    make_folder(src, 5, seed0=500)
    dsc.compile_imagefolder(src, out, update=True, workers=1, **OPTS)
    c2 = content(out)
    assert len(c0) == 30 and len(content(out, 1)) == 20 and len(c2) == 25
    assert dsc.tag(out, "paper", version=0) == 0
    assert content(out, tag="paper") == c0 and content(out) == c2
    with pytest.raises(dsc.VersionNotFoundError, match="no tag 'nope'"):
        dsc.open(out, tag="nope")
    with pytest.raises(dsc.VersionNotFoundError, match="no version 9"):
        dsc.open(out, version=9)
    n = dsc.restore(out, tag="paper")
    assert n == 3 and content(out) == c0 and dsc.open(out).version == 3
    log = dsc.log(out)
    assert [e["version"] for e in log] == [0, 1, 2, 3] and log[0]["tags"] == ["paper"]
    assert log[1]["removed"] == 10 and log[2]["added"] == 5 and log[3]["operation"] == "restore 0"
    # vacuum: keep the newest 1; version 0 is tagged; 1 and 2 are recent unless --older-than 0
    r = dsc.vacuum(out, keep=1)
    assert r.removed == [] and r.recent == [1, 2]
    dry = dsc.vacuum(out, keep=1, older_than=0, dry_run=True)
    assert dry.removed == [1, 2] and dry.files > 0 and V.versions(V.Root(out)) == [0, 1, 2, 3]
    r = dsc.vacuum(out, keep=1, older_than="0s")
    assert r.removed == [1, 2] and sorted(r.kept) == [0, 3]
    assert V.versions(V.Root(out)) == [0, 3]
    assert content(out) == c0 and dsc.verify(out).ok and dsc.verify(out, version=0).ok
    assert not (out / "image" / "c" / "1").exists()  # the slot only version 2 used (the 5 added images)
    dsc.tag(out, "paper", delete=True)
    r = dsc.vacuum(out, keep=1, older_than=0)
    assert r.removed == [0] and V.versions(V.Root(out)) == [3] and content(out) == c0
    with pytest.raises(dsc.ConfigError):
        dsc.vacuum(out, keep=0)
    with pytest.raises(dsc.ConfigError, match="duration"):
        dsc.vacuum(out, older_than="soon")


def test_vacuum_removes_unreferenced_slots(tmp_path):
    src = tmp_path / "src"
    make_folder(src, 128)  # two shards of 64
    out = tmp_path / "out"
    dsc.compile_imagefolder(src, out, workers=1, **OPTS)
    ds = dsc.open(out)
    for k in ds.keys[:64]:  # every sample of slot 0
        (src / k).unlink()
    del ds
    dsc.compile_imagefolder(src, out, update=True, workers=1, **OPTS)
    assert (out / "image" / "c" / "0").exists()
    r = dsc.vacuum(out, keep=1, older_than=0)
    assert r.removed == [0] and not (out / "image" / "c" / "0").exists() and (out / "image" / "c" / "1").exists()
    assert len(dsc.open(out)) == 64 and dsc.verify(out).ok


def _vacuum_fixture(tmp_path):
    """A dataset with 3 versions, a slot only old versions use, a pinned-then-closed version, and the leftovers
    of an update interrupted after writing a shard (its transaction and its slot)."""
    from dsc.compiler import journal

    src = tmp_path / "src"
    make_folder(src, 128)
    out = tmp_path / "out"
    dsc.compile_imagefolder(src, out, workers=1, **OPTS)
    for k in dsc.open(out).keys[:64]:  # every sample of slot 0 (the handle's pin file stays behind)
        (src / k).unlink()
    dsc.compile_imagefolder(src, out, update=True, workers=1, **OPTS)
    make_folder(src, 70, seed0=5000)
    dsc.compile_imagefolder(src, out, update=True, workers=1, **OPTS)
    make_folder(src, 70, seed0=9000)

    def stop(self, result, inputs):
        raise KeyboardInterrupt("killed")
    with pytest.MonkeyPatch.context() as m:
        m.setattr(journal.Journal, "record", stop)
        with pytest.raises(KeyboardInterrupt):
            dsc.compile_imagefolder(src, out, update=True, workers=1, **OPTS)
    assert (out / V.TXN).is_dir()
    return out


def test_vacuum_reports_exactly_the_files_and_bytes_it_removes(tmp_path):
    out = _vacuum_fixture(tmp_path)
    before = tree_size(out)
    dry = dsc.vacuum(out, keep=1, older_than=0, dry_run=True)
    assert dry.removed == [0, 1] and tree_size(out) == before  # (a dry run removes nothing)
    r = dsc.vacuum(out, keep=1, older_than=0)
    after = tree_size(out)
    assert r.removed == [0, 1]
    assert (r.files, r.bytes) == (before[0] - after[0], before[1] - after[1]) == (dry.files, dry.bytes)
    shard = 64 * 8 * 8 * 3
    assert r.bytes > 2 * shard  # slot 0 and the interrupted update's shard are among them
    assert dsc.verify(out).ok and len(dsc.open(out)) == 134


def test_vacuum_cli_prints_what_it_removes(tmp_path):
    import re

    from click.testing import CliRunner

    from dsc.cli import main

    out = _vacuum_fixture(tmp_path)
    printed = {}
    for flag in ("--dry-run", None):
        before = tree_size(out)
        r = CliRunner().invoke(main, ["vacuum", str(out), "--keep", "1", "--older-than", "0", *([flag] if flag else [])])
        assert r.exit_code == 0, r.output
        m = re.search(r"remove[d]? 2 versions \(0, 1\) and ([\d,]+) files \(([\d,]+) bytes", r.output)
        assert m, r.output
        printed[flag] = tuple(int(g.replace(",", "")) for g in m.groups())
        if flag is None:
            after = tree_size(out)
            assert printed[None] == (before[0] - after[0], before[1] - after[1])
    assert printed["--dry-run"] == printed[None]


def test_writing_into_the_view_does_not_change_a_version(tmp_path):
    src, _, out = compiled(tmp_path, 20)
    c0 = content(out)
    labels = out / "label" / "c" / "0"
    labels.write_bytes(b"\0" * labels.stat().st_size)  # a plain Zarr writer scribbles on the view
    assert content(out) == c0
    report = dsc.verify(out)
    assert not report.ok and "top-level view" in str(report.problems[0])
    from dsc.versions import repair_view

    repair_view(out)
    assert dsc.verify(out).ok


def test_open_cost_does_not_grow_with_versions(tmp_path):
    """Opening reads one record, whatever the length of the history."""
    src, paths, out = compiled(tmp_path, 12)
    for i in range(12):
        os.rename(paths[i], paths[i].with_name("x" + paths[i].name))
        paths[i] = paths[i].with_name("x" + paths[i].name)
        dsc.compile_imagefolder(src, out, update=True, workers=1, **OPTS)
    from dsc.store import local as files

    reads = []
    real = files.Root.read

    def counting(self, rel, *a, **kw):
        reads.append(rel)
        return real(self, rel, *a, **kw)
    files.Root.read = counting
    try:
        dsc.open(out)
    finally:
        files.Root.read = real
    records = [r for r in reads if r.startswith(V.LOG)]
    assert records == [f"{V.LOG}/12.json"]


# ----------------------------------------------------------------------------- detection
def test_coco_label_fix_moves_no_pixels(tmp_path, monkeypatch):
    from dsc.synthetic import detection_scenes, write_coco

    scenes = detection_scenes(10, seed=3)
    ann, images = write_coco(tmp_path / "coco", scenes)
    out = tmp_path / "out"
    dsc.compile_coco(ann, images, out, max_side=64, workers=1, progress=False)
    before = shard_stats(out)
    data = json.loads(ann.read_text())
    first = data["annotations"][0]
    first["category_id"] = next(c["id"] for c in data["categories"] if c["id"] != first["category_id"])
    first["bbox"] = [first["bbox"][0] + 1, first["bbox"][1], first["bbox"][2] - 1, first["bbox"][3]]
    ann.write_text(json.dumps(data))
    counter = DecodeCounter(monkeypatch, tmp_path)
    r = dsc.compile_coco(ann, images, out, max_side=64, update=True, workers=1, progress=False)
    assert r.plan["relabelled"] == 1 and r.plan["decoded"] == 0 and counter.names == []
    assert shard_stats(out) == before
    fresh = tmp_path / "fresh"
    dsc.compile_coco(ann, images, fresh, max_side=64, workers=1, progress=False)
    a, b = dsc.open(out), dsc.open(fresh)
    ia = {k: i for i, k in enumerate(a.keys)}
    for j, k in enumerate(b.keys):
        x, y = a[ia[k]], b[j]
        assert np.array_equal(x["image"].numpy(), y["image"].numpy())
        assert np.allclose(x["boxes"].numpy(), y["boxes"].numpy(), atol=1e-4)
        assert x["labels"].tolist() == y["labels"].tolist()


# ----------------------------------------------------------------------------- Delta Lake
def _jpeg_bytes(seed: int) -> bytes:
    import io

    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (12, 14, 3), dtype=np.uint8)).save(buf, "JPEG", quality=90)
    return buf.getvalue()


def _rows(ids):
    import pyarrow as pa

    return pa.table({"image": [_jpeg_bytes(i) for i in ids], "label": [i % 3 for i in ids],
                     "id": [f"r{i}" for i in ids]})


@pytest.mark.parametrize("key_column", ["id", None])
def test_delta_table_across_three_table_versions(tmp_path, monkeypatch, key_column):
    deltalake = pytest.importorskip("deltalake")
    table = tmp_path / "table"
    deltalake.write_deltalake(str(table), _rows(range(0, 60)))  # table version 0
    out = tmp_path / "out"
    kw = dict(key_column=key_column, size=8, shard_size=32, workers=1, progress=False)
    dsc.compile_delta(str(table), out, **kw)
    assert dsc.open(out).manifest.source["table_version"] == 0 and len(dsc.open(out)) == 60
    deltalake.write_deltalake(str(table), _rows(range(60, 80)), mode="append")  # version 1: +20
    deltalake.DeltaTable(str(table)).delete("id = 'r5' OR id = 'r61'")  # version 2: -2 (files rewritten)
    counter = DecodeCounter(monkeypatch, tmp_path)
    r = dsc.compile_delta(str(table), out, update=True, **kw)
    assert r.committed and r.plan["decoded"] == 19 and len(counter.names) == 19  # rows 60..79 but r61
    assert r.plan["added"] == 19 and r.plan["removed"] == 1
    ds = dsc.open(out)
    assert len(ds) == 78 and ds.manifest.source["table_version"] == 2
    fresh = tmp_path / "fresh"
    dsc.compile_delta(str(table), fresh, **kw)
    if key_column:  # keys are the ids: the same set of samples
        assert content(out) == content(fresh)
    else:  # keys are file#row and rows moved to rewritten files: compare the samples without keys
        assert {c[1:] for c in content(out)} == {c[1:] for c in content(fresh)}
    # time travel in the table: the dataset of table version 0
    old = tmp_path / "old"
    dsc.compile_delta(str(table), old, version=0, **kw)
    assert len(dsc.open(old)) == 60 and dsc.open(old).manifest.source["table_version"] == 0
    with pytest.raises(dsc.SourceError, match="no version 9; its latest is 2"):
        dsc.compile_delta(str(table), tmp_path / "x", version=9, **kw)
    assert dsc.verify(out).ok


def test_delta_partition_columns_and_errors(tmp_path):
    deltalake = pytest.importorskip("deltalake")
    table = tmp_path / "table"
    deltalake.write_deltalake(str(table), _rows(range(12)), partition_by=["label"])
    out = tmp_path / "out"
    dsc.compile_delta(str(table), out, key_column="id", size=8, workers=1, progress=False)
    ds = dsc.open(out)
    for i, k in enumerate(ds.keys):
        assert int(ds[i]["label"]) == int(k[1:]) % 3  # the label is the partition value from the log
    with pytest.raises(dsc.SourceError, match="not a Delta table"):
        dsc.compile_delta(str(tmp_path), tmp_path / "o", progress=False)
    with pytest.raises(dsc.ConfigError, match=r"got hdfs://"):
        dsc.compile_delta("hdfs://host/table", tmp_path / "o", progress=False)  # (s3:// works: test_cluster_remote)


# ----------------------------------------------------------------------------- CLI
def test_cli_versions_commands(tmp_path):
    from click.testing import CliRunner

    from dsc.cli import main

    src = tmp_path / "src"
    paths = make_folder(src, 12)
    out = tmp_path / "out"
    run = lambda *a: CliRunner().invoke(main, [str(x) for x in a])  # noqa: E731
    assert run("compile", "imagefolder", src, out, "--size", "8", "-q").exit_code == 0
    paths[0].unlink()
    r = run("compile", "imagefolder", src, out, "--update", "--dry-run", "-q")
    assert r.exit_code == 0 and "-1 removed" in r.output and "dry run" in r.output
    r = run("compile", "imagefolder", src, out, "--update", "-q")
    assert r.exit_code == 0 and "update of version 0" in r.output and "version 1 of" in r.output
    r = run("compile", "imagefolder", src, out, "--update", "--size", "9", "-q")
    assert r.exit_code == 1 and "new compile" in r.output and "Traceback" not in r.output
    assert run("tag", out, "v0", "--version", "0").exit_code == 0
    r = run("log", out)
    assert r.exit_code == 0 and "version 0 [v0]" in r.output and "version 1" in r.output and "-1" in r.output
    r = run("info", out)
    assert "version   1 (the latest; 2 versions on disk" in r.output
    assert "version   0 (latest is 1" in run("info", out, "--version", "0").output
    r = run("verify", out, "--version", "0")
    assert r.exit_code == 0 and "version 0 of" in r.output
    r = run("restore", out, "--tag", "v0")
    assert r.exit_code == 0 and "version 2" in r.output
    r = run("vacuum", out, "--keep", "1", "--older-than", "0", "--dry-run")
    assert r.exit_code == 0 and "would remove 1 version (1)" in r.output and "; kept versions 0, 2" in r.output
    r = run("vacuum", out, "--keep", "1", "--older-than", "0")
    assert r.exit_code == 0 and "removed 1 version (1)" in r.output
    r = run("restore", out, "--version", "1")
    assert r.exit_code == 1 and "no version 1" in r.output and "Traceback" not in r.output
    assert run("restore", out).exit_code == 2
    r = run("verify", out, "--repair-view")
    assert r.exit_code == 0 and "now shows version 2" in r.output
    r = json.loads(run("log", out, "--json").output)
    assert [e["version"] for e in r] == [0, 2]
    for cmd in ("log", "tag", "restore", "vacuum"):
        assert run(cmd, "--help").exit_code == 0


def test_a_crash_between_commit_and_view_refresh(tmp_path, monkeypatch):
    """The version is committed (dsc reads it); the stale plain-Zarr view is refreshed by the next writer."""
    from dsc.compiler import update

    src, paths, out = compiled(tmp_path, 20)
    paths[0].unlink()

    def crash(*a, **kw):
        raise KeyboardInterrupt("killed")
    monkeypatch.setattr(update.view, "refresh", crash)
    with pytest.raises(KeyboardInterrupt):
        dsc.compile_imagefolder(src, out, update=True, workers=1, **OPTS)
    monkeypatch.undo()
    assert dsc.open(out).version == 1 and len(dsc.open(out)) == 19
    assert not dsc.verify(out).ok  # the view still shows version 0
    assert not dsc.compile_imagefolder(src, out, update=True, workers=1, **OPTS).committed
    assert dsc.verify(out).ok  # the next update refreshed it


def test_a_crash_right_after_the_commit_leaves_no_transaction(tmp_path, monkeypatch):
    """A kill between the commit and the removal of its transaction folder: the next update (even one with
    nothing to do) removes the leftover, and verify stays clean."""
    from dsc.compiler import update

    src, paths, out = compiled(tmp_path, 20)
    paths[0].unlink()
    commit = update.versions.commit

    def commit_then_die(*a, **kw):
        commit(*a, **kw)
        raise KeyboardInterrupt("killed")
    monkeypatch.setattr(update.versions, "commit", commit_then_die)
    with pytest.raises(KeyboardInterrupt):
        dsc.compile_imagefolder(src, out, update=True, workers=1, **OPTS)
    monkeypatch.undo()
    assert dsc.open(out).version == 1 and (out / V.TXN / "1").exists()
    assert not dsc.compile_imagefolder(src, out, update=True, workers=1, **OPTS).committed
    assert not (out / V.TXN / "1").exists() and dsc.verify(out).ok and len(dsc.open(out)) == 19


# ----------------------------------------------------------------------------- every source
def full_content(path) -> dict:
    """key -> every field of the sample as bytes (image, label, boxes, labels, mask...)."""
    ds = dsc.open(path)
    out = {}
    for i, k in enumerate(ds.keys):
        s = ds[i]
        out[k] = {name: (v.numpy().tobytes() if hasattr(v, "numpy") else repr(v)) for name, v in s.items()
                  if name != "index"}
    return out


def _det_change(kind, root, scenes):
    """The source grows by two scenes, loses one, and one annotation is fixed."""
    from dsc.synthetic import write_voc, write_yolo

    if kind == "yolo":
        write_yolo(root, scenes[:10])
        lab = root / "labels" / "train" / (Path(scenes[1]["file"]).stem + ".txt")
        lines = lab.read_text().splitlines()
        lines[0] = "2" + lines[0][1:]
        lab.write_text("\n".join(lines) + "\n")
        (root / "images" / "train" / scenes[2]["file"]).unlink()
        (root / "labels" / "train" / (Path(scenes[2]["file"]).stem + ".txt")).unlink()
    elif kind == "voc":
        write_voc(root, scenes[:10])
        ann = root / "Annotations" / (Path(scenes[1]["file"]).stem + ".xml")
        ann.write_text(ann.read_text().replace("<name>cat</name>", "<name>bird</name>", 1)
                       .replace("<name>dog</name>", "<name>bird</name>", 1))
        ids = root / "ImageSets" / "Main" / "trainval.txt"
        ids.write_text("\n".join(i for i in ids.read_text().split() if i != Path(scenes[2]["file"]).stem) + "\n")


@pytest.mark.parametrize("kind", ["yolo", "voc", "segfolder", "voc-masks"])
def test_update_of_every_file_source_equals_a_fresh_compile(kind, tmp_path, monkeypatch):
    from dsc.synthetic import (detection_scenes, seg_scenes, write_segfolder, write_voc, write_voc_segmentation,
                               write_yolo)

    root = tmp_path / "src"
    out, fresh = tmp_path / "out", tmp_path / "fresh"
    opts = dict(max_side=48, workers=1, progress=False)
    if kind in ("yolo", "voc"):
        scenes = detection_scenes(10, seed=4)
        (write_yolo if kind == "yolo" else write_voc)(root, scenes[:8])
        compile_fn = (lambda o, **kw: dsc.compile_yolo(root, o, **kw)) if kind == "yolo" else \
            (lambda o, **kw: dsc.compile_voc(root, o, **kw))
        compile_fn(out, **opts)
        _det_change(kind, root, scenes)
        expect_decoded = 2
    else:
        scenes = seg_scenes(10, seed=4) if kind == "segfolder" else detection_scenes(10, seed=4)
        if kind == "segfolder":
            write_segfolder(root, scenes[:8])
            compile_fn = lambda o, **kw: dsc.compile_segfolder(root, o, **kw)  # noqa: E731
        else:
            write_voc_segmentation(root, scenes[:8])
            compile_fn = lambda o, **kw: dsc.compile_voc(root, o, split="train", masks=True, **kw)  # noqa: E731
        compile_fn(out, **opts)
        shutil.rmtree(root)
        (write_segfolder if kind == "segfolder" else write_voc_segmentation)(root, scenes[:10])
        expect_decoded = None  # rewritten files (same bytes) are recognised by their content
    counter = DecodeCounter(monkeypatch, tmp_path)
    r = compile_fn(out, update=True, **opts)
    assert r.committed
    if expect_decoded is not None:
        assert r.plan["decoded"] == expect_decoded == len(counter.names), r.plan
        # the fixed annotation (and, for YOLO, whose image ids are positions, the images after the removed one)
        assert r.plan["relabelled"] >= 1 and r.plan["removed"] == 1
    else:
        assert r.plan["decoded"] == 2 and r.plan["added"] == 2 and r.plan["unchanged"] == 8, r.plan
    compile_fn(fresh, **opts)
    assert full_content(out) == full_content(fresh)
    assert dsc.verify(out).ok


def test_update_with_a_dask_cluster(tmp_path):
    distributed = pytest.importorskip("dask.distributed")
    src = tmp_path / "src"
    make_folder(src, 40)
    out, fresh = tmp_path / "out", tmp_path / "fresh"
    dsc.compile_imagefolder(src, out, workers=1, **{**OPTS, "shard_size": 8})
    make_folder(src, 12, seed0=900)
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                                  dashboard_address=None) as cluster, distributed.Client(cluster) as client:
        r = dsc.compile_imagefolder(src, out, update=True, executor=client, **{**OPTS, "shard_size": 8})
    assert r.committed and r.plan["decoded"] == 12
    dsc.compile_imagefolder(src, fresh, workers=1, **{**OPTS, "shard_size": 8})
    assert content(out) == content(fresh) and dsc.verify(out).ok


def test_update_of_a_parquet_table(tmp_path, monkeypatch):
    pq = pytest.importorskip("pyarrow.parquet")
    table = tmp_path / "table"
    table.mkdir()
    pq.write_table(_rows(range(30)), table / "part-0.parquet")
    out, fresh = tmp_path / "out", tmp_path / "fresh"
    kw = dict(key_column="id", size=8, workers=1, progress=False)
    dsc.compile_table(table, out, **kw)
    pq.write_table(_rows(range(30, 40)), table / "part-1.parquet")  # a new file of 10 rows
    relabelled = _rows(range(30)).to_pydict()
    relabelled["label"][4] = (relabelled["label"][4] + 1) % 3  # a label fix: the file is rewritten
    import pyarrow as pa

    pq.write_table(pa.table(relabelled), table / "part-0.parquet")
    counter = DecodeCounter(monkeypatch, tmp_path)
    r = dsc.compile_table(table, out, update=True, **kw)
    assert r.plan["decoded"] == 10 == len(counter.names) and r.plan["relabelled"] == 1, r.plan
    dsc.compile_table(table, fresh, **kw)
    assert content(out) == content(fresh)


# ----------------------------------------------------------------------------- found by reviews
def test_update_refuses_duplicate_keys_and_table_keys_are_paths(tmp_path):
    pq = pytest.importorskip("pyarrow.parquet")
    table = tmp_path / "table"
    for part in ("a", "b"):  # two files of the same name in a partitioned folder: keys stay unique
        (table / part).mkdir(parents=True)
        pq.write_table(_rows(range(3)), table / part / "part-0.parquet")
    out = tmp_path / "out"
    dsc.compile_table(table, out, size=8, workers=1, progress=False)
    assert sorted(dsc.open(out).keys)[:2] == ["a/part-0.parquet#0", "a/part-0.parquet#1"]
    r = dsc.compile_table(table, out, size=8, update=True, workers=1, progress=False)
    assert not r.committed and len(dsc.open(out)) == 6  # nothing changed: nothing lost
    out2 = tmp_path / "out2"
    r = dsc.compile_table(table, out2, key_column="label", size=8, workers=1, progress=False)  # keys repeat
    assert any("more than one input" in w for w in r.warnings)
    with pytest.raises(dsc.SourceError, match="more than one input"):
        dsc.compile_table(table, out2, key_column="label", size=8, update=True, workers=1, progress=False)


def test_update_refuses_other_source_parameters_shard_size_and_kind(tmp_path):
    deltalake = pytest.importorskip("deltalake")
    table = tmp_path / "table"
    deltalake.write_deltalake(str(table), _rows(range(10)))
    out = tmp_path / "out"
    kw = dict(size=8, workers=1, progress=False)
    dsc.compile_delta(str(table), out, key_column="id", **kw)
    with pytest.raises(dsc.ConfigError, match="key_column='id'.*--key-column"):
        dsc.compile_delta(str(table), out, update=True, **kw)  # forgot --key-column
    with pytest.raises(dsc.ConfigError, match="shard size"):
        dsc.compile_delta(str(table), out, key_column="id", update=True, shard_size=3, **kw)
    with pytest.raises(dsc.ConfigError, match="version 0, 1, 2"):
        dsc.compile_delta(str(table), tmp_path / "x", version=-1, **kw)
    src = tmp_path / "src"
    make_folder(src, 4)
    with pytest.raises(dsc.ConfigError, match="compiled from a delta source"):
        dsc.compile_imagefolder(src, out, update=True, **kw)
    assert dsc.compile_delta(str(table), out, key_column="id", update=True, **kw).committed is False


def test_skipped_inputs_do_not_make_empty_versions(tmp_path):
    src = tmp_path / "src"
    make_folder(src, 10)
    (src / "c0" / "broken.jpg").write_bytes(b"not a jpeg")
    out = tmp_path / "out"
    dsc.compile_imagefolder(src, out, on_error="skip", workers=1, **OPTS)
    r = dsc.compile_imagefolder(src, out, update=True, workers=1, **OPTS)  # on_error=skip is kept
    assert not r.committed and V.versions(V.Root(out)) == [0]
    make_folder(src, 2, seed0=77)
    r = dsc.compile_imagefolder(src, out, update=True, workers=1, **OPTS)
    assert r.committed and len(dsc.open(out)) == 12 and [s["key"] for s in r.skipped] == ["c0/broken.jpg"]


def test_writers_refuse_links_inside_the_dataset(tmp_path):
    src, _, out = compiled(tmp_path, 6)
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "precious").write_text("keep me")
    (out / "_dsc" / "objects" / "zz").symlink_to(victim)
    dsc.vacuum(out, keep=1, older_than=0)  # a link among the objects is not dsc's: left alone
    assert (victim / "precious").exists()
    shutil.rmtree(out / "_dsc" / "pins", ignore_errors=True)
    (out / "_dsc" / "pins").symlink_to(victim)
    for call in (lambda: dsc.vacuum(out, keep=1, older_than=0), lambda: dsc.tag(out, "t"),
                 lambda: dsc.restore(out, version=0),
                 lambda: dsc.compile_imagefolder(src, out, update=True, workers=1, **OPTS)):
        with pytest.raises(dsc.UnsafePathError, match="symbolic link"):
            call()
    assert (victim / "precious").read_text() == "keep me"


def test_tag_waits_for_no_writer_and_missing_objects_are_named(tmp_path):
    from dsc.compiler.staging import OutLock
    from dsc.versions import repair_view

    src, _, out = compiled(tmp_path, 6)
    with OutLock(out, "vacuum"):
        with pytest.raises(dsc.CompileLockedError):
            dsc.tag(out, "golden", version=0)
    m = V.read_record(V.Root(out), 0)["manifest"]
    sha = m.files["label/c/0"]["sha256"]
    (out / V.object_path(sha)).unlink()
    with pytest.raises(dsc.CorruptDatasetError, match=r"label/c/0 \(version content _dsc/objects/"):
        dsc.open(out).get_batch([0])
    repair_view(out)  # the view still has the exact bytes: the object is taken back from it
    assert dsc.verify(out).ok


def test_opening_the_latest_retries_when_it_is_vacuumed_meanwhile(tmp_path, monkeypatch):
    src, paths, out = compiled(tmp_path, 6)
    paths[0].unlink()
    dsc.compile_imagefolder(src, out, update=True, workers=1, **OPTS)
    real = V.resolve
    calls = []

    def stale_first(root, version=None, tag=None):  # the first resolve sees a version about to be vacuumed
        calls.append(1)
        return 0 if len(calls) == 1 else real(root, version, tag)
    monkeypatch.setattr(V, "resolve", stale_first)
    dsc.vacuum(out, keep=1, older_than=0)
    assert dsc.open(out).version == 1 and len(calls) == 2


def test_an_update_takes_each_annotation_digest_once(tmp_path, monkeypatch):
    """An update of a COCO set with a relabelled annotation, a changed image and a new one takes each record's
    annotation digest once (the plan's comparison, the journal's fingerprint, the new rows and the relabelled
    row's column share it), counted at the digest itself."""
    from collections import Counter

    from dsc.compiler.sources.base import Target
    from dsc.synthetic import _write_scene_image, detection_scenes, write_coco

    scenes = detection_scenes(10, seed=3)
    ann, images = write_coco(tmp_path / "coco", scenes[:9])
    out = tmp_path / "out"
    dsc.compile_coco(ann, images, out, max_side=64, workers=1, progress=False)
    ann, images = write_coco(tmp_path / "coco", scenes)  # a new image
    data = json.loads(ann.read_text())
    first = data["annotations"][0]
    first["bbox"] = [first["bbox"][0] + 1, first["bbox"][1], first["bbox"][2] - 1, first["bbox"][3]]  # relabelled
    ann.write_text(json.dumps(data))
    changed = dict(scenes[1], colors=[(7, 9, 11)] * len(scenes[1]["boxes"]))
    _write_scene_image(changed, images / scenes[1]["file"])  # changed pixels
    calls, real = Counter(), Target.digest

    def counting(self):
        calls[self.image_id] += 1
        return real(self)
    monkeypatch.setattr(Target, "digest", counting)
    r = dsc.compile_coco(ann, images, out, max_side=64, update=True, workers=1, progress=False)
    assert (r.plan["relabelled"], r.plan["changed"], r.plan["added"]) == (1, 1, 1)
    assert sorted(calls) == list(range(100, 110)) and set(calls.values()) == {1}, calls
