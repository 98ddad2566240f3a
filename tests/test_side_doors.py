"""Nothing committed is lost through a side door (issue 36): a dataset named through a link, a vacuum racing a
first compile, a pinned clock, two writers refreshing one view, a push of an older copy, cached small files
and shards damaged on disk, a reused pid, a damaged base of an update, version numbers that are not numbers.
Each scenario is the one the issue describes, its race windows held open by monkeypatched steps (no sleeps)."""
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

import dsc
from dsc.errors import CompileLockedError, CorruptDatasetError, VersionConflictError, VersionNotFoundError
from dsc.formats import versions as V
from test_versions import OPTS, make_folder


def _small(tmp_path: Path, n: int = 24):
    """(source folder, its dataset compiled as version 0)."""
    src, out = tmp_path / "src", tmp_path / "real.dsc"
    make_folder(src, n)
    dsc.compile_imagefolder(src, out, workers=1, **OPTS)
    return src, out


# --------------------------------------------------------------------------- 1. one lock whatever path names it
def _update_racing_a_vacuum(monkeypatch, src, real, alias):
    """Update ``real`` with 8 more images while, between writing its shards and committing, ``dsc.vacuum(alias)``
    runs: asserts the update committed version 1 and the vacuum was refused; returns the refusal."""
    make_folder(src, 8, seed0=500)
    commit, seen = V.commit, []

    def vacuum_through_the_alias_first(store, record):
        try:
            seen.append(dsc.vacuum(alias, older_than=0))
        except CompileLockedError as e:
            seen.append(e)
        return commit(store, record)
    monkeypatch.setattr(V, "commit", vacuum_through_the_alias_first)
    r = dsc.compile_imagefolder(src, real, update=True, workers=1, **OPTS)
    monkeypatch.setattr(V, "commit", commit)
    assert r.committed and r.version == 1
    assert len(seen) == 1 and isinstance(seen[0], CompileLockedError), seen
    return seen[0]


def test_a_vacuum_through_a_link_waits_for_an_update_of_the_real_path(tmp_path, monkeypatch):
    """`dsc vacuum alias` while an update of `real` is between writing its shards and committing: the vacuum is
    refused (one lock), and the version the update commits is whole."""
    src, real = _small(tmp_path)
    alias = tmp_path / "alias.dsc"
    alias.symlink_to(real)
    _update_racing_a_vacuum(monkeypatch, src, real, alias)
    assert dsc.verify(real).ok and len(dsc.open(real)) == 32


def test_writers_through_a_link_and_through_the_folder_take_one_lock(tmp_path):
    from dsc.store.local import OutLock

    src, real = _small(tmp_path, 8)
    (tmp_path / "links").mkdir()
    alias = tmp_path / "links" / "alias.dsc"
    alias.symlink_to(real)
    parent_link = tmp_path / "parent"
    parent_link.symlink_to(tmp_path)
    make_folder(src, 4, seed0=700)
    for held, other in ((real, alias), (alias, real), (parent_link / "real.dsc", alias)):
        with OutLock(held, "update"):
            with pytest.raises(CompileLockedError, match=r"another dsc update \(pid \d+\) is writing"):
                dsc.compile_imagefolder(src, other, update=True, workers=1, **OPTS)
            with pytest.raises(CompileLockedError):
                dsc.vacuum(other)
            with pytest.raises(CompileLockedError):
                dsc.tag(other, "x")
    assert dsc.compile_imagefolder(src, alias, update=True, workers=1, **OPTS).version == 1
    assert dsc.verify(real).ok


@pytest.fixture
def bind_mount(tmp_path):
    """``bind_mount(folder)``: the folder mounted at another path (no link: its real path is another; skipped where
    this process may not mount)."""
    import subprocess

    mounted = []

    def mount(folder: Path) -> Path:
        at = tmp_path / f"bound-{len(mounted)}"
        at.mkdir()
        r = subprocess.run(["mount", "--bind", str(folder), str(at)], capture_output=True)
        if r.returncode:
            pytest.skip(f"cannot bind-mount here: {r.stderr.decode().strip()}")
        mounted.append(at)
        return at
    try:
        yield mount
    finally:
        for at in mounted:
            subprocess.run(["umount", "-l", str(at)])


def test_a_vacuum_through_a_bind_mount_waits_for_an_update_of_the_real_path(tmp_path, monkeypatch, bind_mount):
    """The same race as through a link, through a second path to the folder that no link resolution finds (a
    bind mount): the dataset folder itself is locked, so the vacuum is refused and version 1 is whole."""
    from dsc.store.local import OutLock

    src, real = _small(tmp_path)
    alias = bind_mount(real)
    assert os.path.realpath(alias) != os.path.realpath(real) and os.path.samefile(alias, real)
    refused = _update_racing_a_vacuum(monkeypatch, src, real, alias)
    assert "through another path to the same folder" in str(refused)
    assert dsc.verify(real).ok and len(dsc.open(real)) == 32
    for held, other in ((real, alias), (alias, real)):  # every writer, either way round; then free again
        with OutLock(held, "update"):
            with pytest.raises(CompileLockedError):
                dsc.compile_imagefolder(src, other, update=True, workers=1, **OPTS)
            with pytest.raises(CompileLockedError):
                dsc.tag(other, "x")
    dsc.tag(alias, "x")
    assert dsc.log(real)[-1]["tags"] == ["x"]


# --------------------------------------------------------------------------- 3. retention by the store's clock
def test_source_date_epoch_does_not_shorten_the_retention_period(tmp_path, monkeypatch):
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1000000000")  # 2001: every record says so
    src, out = _small(tmp_path, 8)
    make_folder(src, 4, seed0=900)
    dsc.compile_imagefolder(src, out, update=True, workers=1, **OPTS)
    assert [e["created"] for e in dsc.log(out)] == ["2001-09-09T01:46:40Z"] * 2
    r = dsc.vacuum(out)  # the default 7 days: version 0 was superseded seconds ago
    assert r.removed == [] and r.recent == [0]
    assert len(dsc.open(out, version=0)) == 8
    assert dsc.vacuum(out, older_than=0).removed == [0]  # (an explicit 0 still removes it)


# --------------------------------------------------------------------------- 11. pins only for real versions
@pytest.mark.parametrize("bad", ["../../../X", -1, 1.5, 10 ** 15, "0", True])
def test_a_version_that_is_not_a_number_leaves_no_file(tmp_path, bad):
    src, out = _small(tmp_path, 4)
    before = sorted(str(p) for p in tmp_path.rglob("*"))
    with pytest.raises(VersionNotFoundError, match="a version is a whole number|has no version"):
        dsc.open(out, version=bad)
    assert sorted(str(p) for p in tmp_path.rglob("*")) == before
    with pytest.raises(VersionNotFoundError, match="has no version 7"):
        dsc.open(out, version=7)
    assert not (out / V.PINS / "7").exists()


# --------------------------------------------------------------------------- object storage
@pytest.fixture(scope="module")
def s3(s3_server):
    pytest.importorskip("obstore")
    from object_servers import use_server

    with pytest.MonkeyPatch.context() as m:
        use_server(s3_server, m)
        m.delenv("DSC_CACHE_DIR", raising=False)
        s3_server.bucket("dsc-doors")
        yield s3_server


def _two_versions(tmp_path: Path, n0: int = 12, n1: int = 5) -> Path:
    """A local dataset: version 0 of ``n0`` images, version 1 adds ``n1``."""
    src, out = tmp_path / "src2", tmp_path / "two.dsc"
    make_folder(src, n0)
    dsc.compile_imagefolder(src, out, workers=1, **OPTS)
    make_folder(src, n1, seed0=4000)
    dsc.compile_imagefolder(src, out, update=True, workers=1, **OPTS)
    return out


def test_a_vacuum_of_a_url_racing_its_first_compile_keeps_version_0(s3, tmp_path, monkeypatch):
    """The compile has uploaded its shards and is about to commit when `dsc vacuum URL --older-than 0` starts;
    the compile commits and ends before the vacuum takes its lease. Version 0 is whole afterwards."""
    import threading

    from dsc import versions as vacuums
    from dsc.compiler import upload

    src = tmp_path / "src"
    make_folder(src, 24)
    url = "s3://dsc-doors/first-compile"
    shards_up, go = threading.Event(), threading.Event()
    real_push, real_writing = upload.push, vacuums.writing

    def push_when_told(*a, **k):
        shards_up.set()
        assert go.wait(60)
        return real_push(*a, **k)
    monkeypatch.setattr(upload, "push", push_when_told)
    errors = []

    def compile_it():
        try:
            dsc.compile_imagefolder(src, url, workers=1, cache_dir=str(tmp_path / "stage"), **OPTS)
        except BaseException as e:  # noqa: BLE001
            errors.append(e)
    t = threading.Thread(target=compile_it)
    t.start()
    assert shards_up.wait(60)

    def the_compile_ends_first(store, what, nodes=()):
        go.set()
        t.join(60)
        return real_writing(store, what, nodes)
    monkeypatch.setattr(vacuums, "writing", the_compile_ends_first)
    r = dsc.vacuum(url, older_than=0)
    t.join(60)
    assert not errors, errors
    assert r.removed == [] and r.kept == [0]
    assert dsc.verify(url).ok
    assert len(dsc.open(url, cache_dir=tmp_path / "c")) == 24


def test_two_restores_at_one_url_one_slow_leave_the_latest_view_whole(s3, tmp_path, monkeypatch):
    """Restore A (version 2 = version 0, 12 rows) writes its view slowly; restore B (version 3 = version 1, 17
    rows) commits and writes its whole view meanwhile, then A's chunk writes land. The view is version 3's."""
    from dsc.compiler.upload import push
    from dsc.formats import view
    from dsc.store import object as object_store, open_store

    url = "s3://dsc-doors/two-restores"
    local = _two_versions(tmp_path)
    push(local, url, progress=False)
    store = open_store(url)
    real_put, state = object_store.ObjectStore.put, {"b": None}

    def slow_first_chunk(self, rel, *a, **k):
        if state["b"] is None and "/c" in rel and not rel.startswith(("_dsc/", "image/")):
            state["b"] = "running"  # A is about to write its first chunk: B runs whole first
            state["b"] = dsc.restore(url, version=1)
        return real_put(self, rel, *a, **k)
    monkeypatch.setattr(object_store.ObjectStore, "put", slow_first_chunk)
    assert dsc.restore(url, version=0) == 2
    monkeypatch.setattr(object_store.ObjectStore, "put", real_put)
    assert state["b"] == 3
    m3 = V.read_record(store, 3)["manifest"]
    want, root = view.expected(store, m3)
    import hashlib
    for path, (nbytes, sha) in want.items():
        assert hashlib.sha256(store.get(path)).hexdigest() == sha, path
    assert json.loads(store.get("zarr.json"))["attributes"]["dsc"]["num_samples"] == 17
    assert dsc.verify(url).ok


def test_a_push_of_an_older_copy_does_not_move_a_tag_back(s3, tmp_path, monkeypatch):
    from dsc.compiler.upload import push

    monkeypatch.setenv("DSC_CACHE_DIR", str(tmp_path / "cache"))  # (a push keeps its writer token there)

    url = "s3://dsc-doors/tags"
    local = _two_versions(tmp_path)
    old = tmp_path / "old.dsc"
    shutil.copytree(local, old)
    dsc.tag(old, "prod", version=0)
    dsc.tag(local, "prod", version=1)
    push(local, url, progress=False)
    assert dsc.log(url)[1]["tags"] == ["prod"]
    with pytest.raises(VersionConflictError, match="tag 'prod' names version 1, and this copy's names version 0"):
        push(old, url, progress=False)
    assert dsc.log(url)[1]["tags"] == ["prod"]
    assert dsc.vacuum(url, older_than=0).removed == [0]  # prod keeps version 1
    from click.testing import CliRunner

    from dsc.cli import main

    r = CliRunner().invoke(main, ["push", str(old), url, "-q"])
    assert r.exit_code == 1 and "dsc push does not move a tag back" in r.output and "--force" in r.output, r.output
    r = CliRunner().invoke(main, ["push", str(old), url, "-q", "--force"])  # asked for: moved back
    assert r.exit_code == 0, r.output
    assert V.read_tags(open_store_of(url))[0] == {"prod": 0}  # (version 0 pushed again with it)


def open_store_of(url):
    from dsc.store import open_store

    return open_store(url)


# --------------------------------------------------------------------------- the shard cache
@pytest.fixture(scope="module")
def pushed(s3, tmp_path_factory):
    """(url, the local dataset pushed there): 17 samples in one version."""
    from dsc.compiler.upload import push

    tmp = tmp_path_factory.mktemp("pushed")
    src, local = tmp / "src", tmp / "local.dsc"
    make_folder(src, 17)
    dsc.compile_imagefolder(src, local, workers=1, **dict(OPTS, shard_size=8))
    url = "s3://dsc-doors/pushed"
    push(local, url, progress=False)
    return url, local


def _labels(ds) -> list:
    return ds.get_batch(range(len(ds)))["label"].tolist()


def test_a_flipped_bit_in_a_cached_label_object_is_found(pushed, tmp_path):
    """The small files kept in the cache are checked against their hash at open (fetched again when damaged),
    and `dsc cache verify` checks them too."""
    from dsc.runtime.remote import cache_check, mirror_dir
    from dsc.runtime.cache import ShardCache

    url, local = pushed
    want = _labels(dsc.open(local))
    cache = tmp_path / "c"
    assert _labels(dsc.open(url, cache_dir=cache)) == want
    m = dsc.open(local).manifest
    obj = mirror_dir(ShardCache(cache), url) / V.object_path(m.files["label/c/0"]["sha256"])

    def flip():
        data = bytearray(obj.read_bytes())
        data[0] ^= 1  # sample 0's label changes by one
        obj.write_bytes(bytes(data))
    flip()
    assert _labels(dsc.open(url, cache_dir=cache)) == want  # found at open, fetched again
    flip()
    files = len(list(obj.parent.parent.glob("*/*"))) + 3  # (the objects, and 3 shards)
    assert cache_check(cache) == (files, 1)
    assert not obj.exists()
    assert _labels(dsc.open(url, cache_dir=cache)) == want


def test_a_truncated_or_linked_cached_shard_is_the_caches_fault_and_fetched_again(pushed, tmp_path):
    from dsc.formats import layout as L
    from dsc.runtime.cache import ShardCache

    url, local = pushed
    cache = tmp_path / "c"
    want = dsc.open(local)[0]["image"].numpy().tobytes()
    assert dsc.open(url, cache_dir=cache)[0]["image"].numpy().tobytes() == want
    spec = L.shard_specs(dsc.open(local).manifest)[0]
    cached = ShardCache(cache).path(spec.sha256)
    with open(cached, "r+b") as f:
        f.truncate(spec.nbytes // 2)
    with pytest.warns(RuntimeWarning, match=r"in the shard cache was damaged \(.* bytes where the shard has"):
        assert dsc.open(url, cache_dir=cache)[0]["image"].numpy().tobytes() == want
    assert cached.stat().st_size == spec.nbytes
    cached.unlink()
    (tmp_path / "elsewhere").write_bytes(b"x" * spec.nbytes)
    cached.symlink_to(tmp_path / "elsewhere")
    with pytest.warns(RuntimeWarning, match="a symbolic link"):
        assert dsc.open(url, cache_dir=cache)[0]["image"].numpy().tobytes() == want
    assert not cached.is_symlink() and (tmp_path / "elsewhere").read_bytes() == b"x" * spec.nbytes
    cached.unlink()
    cached.symlink_to(tmp_path / "elsewhere")
    from dsc.runtime.remote import cache_check

    assert cache_check(cache)[1] == 1 and not os.path.lexists(cached)  # (cache verify: the link goes)
    cached.symlink_to(tmp_path / "elsewhere")
    assert ShardCache(cache).clear()[0] >= 1 and not os.path.lexists(cached)  # (clear: the link goes too)
    assert (tmp_path / "elsewhere").read_bytes() == b"x" * spec.nbytes


def test_a_leftover_download_of_a_reused_pid_does_not_pin_cache_space(tmp_path):
    """A `.part` of a process that died (its pid alive again: pid 1 of a restarted container) is removed by
    `dsc cache clear` and by the space accounting; one a live download holds is kept."""
    import fcntl

    from dsc.runtime.cache import ShardCache

    cache = ShardCache(tmp_path / "c", limit=10_000)
    d = tmp_path / "c" / "shards" / "ab"
    d.mkdir(parents=True)
    dead = d / f"{'ab' * 32}.1.1.part"  # pid 1 runs, but holds no lock on it
    dead.write_bytes(b"\0" * 8000)
    live = d / f"{'ab' * 31}cd.{os.getpid()}.2.part"
    live.write_bytes(b"\0" * 1000)
    fd = os.open(live, os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        assert cache.usage() == 1000 and not dead.exists()
        dead.write_bytes(b"\0" * 8000)
        assert cache.clear() == (0, 0, 1) and not dead.exists() and live.exists()
    finally:
        os.close(fd)
    assert cache.clear() == (0, 0, 0) and not live.exists()


@pytest.fixture
def read_only(tmp_path):
    """``read_only(folder)``: the folder mounted read-only at another path (a bind mount; skipped where this
    process may not mount)."""
    import subprocess

    mounted = []

    def mount(folder: Path) -> Path:
        at = tmp_path / f"ro-{len(mounted)}"
        at.mkdir()
        for argv in (["mount", "--bind", str(folder), str(at)], ["mount", "-o", "remount,ro,bind", str(at)]):
            r = subprocess.run(argv, capture_output=True)
            if r.returncode:
                if argv[1] != "--bind":
                    subprocess.run(["umount", str(at)])
                pytest.skip(f"cannot make a read-only mount here: {r.stderr.decode().strip()}")
        mounted.append(at)
        return at
    try:
        yield mount
    finally:
        for at in mounted:  # (lazy: a handle the test left open must not keep the mount)
            subprocess.run(["umount", "-l", str(at)])


def test_a_pre_warmed_cache_on_a_read_only_mount_serves_what_it_holds(pushed, tmp_path, read_only):
    from dsc.errors import CacheFullError
    from dsc.formats import layout as L
    from dsc.runtime.cache import ShardCache
    from dsc.runtime.remote import warm

    url, local = pushed
    warm(url, cache_dir=tmp_path / "c", progress=False)
    specs = L.shard_specs(dsc.open(local).manifest)
    ShardCache(tmp_path / "c").path(specs[-1].sha256).unlink()  # the last shard: not in the cache
    ro = read_only(tmp_path / "c")
    ds = dsc.open(url, cache_dir=ro)
    ref = dsc.open(local)
    a, b = ds.get_batch(range(8)), ref.get_batch(range(8))  # (the first shard's samples)
    assert a["image"].numpy().tobytes() == b["image"].numpy().tobytes() and a["label"].tolist() == b["label"].tolist()
    with pytest.raises(CacheFullError, match="is not in the cache .* which cannot be written"):
        ds[len(ds) - 1]


# --------------------------------------------------------------------------- 10. a damaged base
def test_an_update_of_a_base_with_a_bit_rotted_object_is_refused_and_an_object_is_reused_only_intact(tmp_path):
    src, out = _small(tmp_path, 16)
    m = dsc.open(out).manifest
    live = out / V.object_path(m.files["live/c/0"]["sha256"])
    good = live.read_bytes()
    live.write_bytes(bytes([good[0] ^ 1]) + good[1:])  # row 0 no longer live, as far as these bytes say
    make_folder(src, 4, seed0=800)
    with pytest.raises(CorruptDatasetError, match=r"version 0, the base of this update, is damaged: live/c/0"):
        dsc.compile_imagefolder(src, out, update=True, workers=1, **OPTS)
    assert [e["version"] for e in dsc.log(out)] == [0]
    live.write_bytes(good)
    assert dsc.compile_imagefolder(src, out, update=True, workers=1, **OPTS).version == 1
    assert dsc.verify(out).ok and len(dsc.open(out)) == 20
    # A writer giving an object whose name is there already, damaged since: the object is written again from
    # the bytes it just hashed (the view's copy here), not reused by its name.
    f = dsc.open(out).manifest.files["checksums/zarr.json"]
    shared = out / V.object_path(f["sha256"])
    kept = shared.read_bytes()
    shared.write_bytes(b" " + kept[1:])
    V.store_objects(out, out, {"checksums/zarr.json": f})
    assert shared.read_bytes() == kept and dsc.verify(out).ok


# --------------------------------------------------------------------------- the small print
def test_overwrite_of_a_dataset_with_history_is_confirmed_or_refused(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from dsc import cli

    src, out = _small(tmp_path, 6)
    run = lambda *a, **k: CliRunner().invoke(cli.main, [str(x) for x in a], **k)  # noqa: E731
    argv = ("compile", "imagefolder", src, out, "--size", "8", "--shard-size", "64", "--workers", "1", "--overwrite", "-q")
    assert run(*argv).exit_code == 0  # one version, no tag: nothing more is lost
    dsc.tag(out, "prod")
    make_folder(src, 2, seed0=300)
    dsc.compile_imagefolder(src, out, update=True, workers=1, **OPTS)
    r = run(*argv)
    assert r.exit_code == 1 and "holds versions 0-1 and tag prod; --overwrite replaces it" in r.output, r.output
    assert "no terminal to ask at" in r.output and [e["version"] for e in dsc.log(out)] == [0, 1]
    monkeypatch.setattr(cli, "_at_a_terminal", lambda: True)
    r = run(*argv, input="n\n")
    assert r.exit_code == 1 and "Replace it? [y/N]" in r.output and len(dsc.log(out)) == 2
    r = run(*argv, input="y\n")
    assert r.exit_code == 0 and "every version and tag it holds (versions 0-1 and tag prod)" in r.output, r.output
    assert [e["version"] for e in dsc.log(out)] == [0] and dsc.log(out)[0]["tags"] == []
    dsc.tag(out, "prod")
    with pytest.warns(UserWarning, match=r"--overwrite replaces .* \(version 0 and tag prod\)"):
        dsc.compile_imagefolder(src, out, overwrite=True, workers=1, **OPTS)


def test_verify_of_a_vacuumed_version_is_not_damage_and_cache_ls_of_no_cache_is_empty(tmp_path):
    from click.testing import CliRunner

    from dsc import cli

    src, out = _small(tmp_path, 6)
    make_folder(src, 2, seed0=300)
    dsc.compile_imagefolder(src, out, update=True, workers=1, **OPTS)
    dsc.vacuum(out, older_than=0)
    r = CliRunner().invoke(cli.main, ["verify", str(out), "--version", "0"])
    assert r.exit_code == cli.VERIFY_NOT_FOUND == 3 and "has no version 0" in r.output, r.output
    assert CliRunner().invoke(cli.main, ["verify", str(out), "--version", "1"]).exit_code == 0
    r = CliRunner().invoke(cli.main, ["cache", "ls", "--cache-dir", str(tmp_path / "none")])
    assert r.exit_code == 0 and "empty (no cache there yet" in r.output and not (tmp_path / "none").exists()
    r = CliRunner().invoke(cli.main, ["cache", "ls", "--cache-dir", str(tmp_path / "none"), "--json"])
    assert r.exit_code == 0 and json.loads(r.output)["datasets"] == []


def test_source_date_epoch_does_not_shorten_the_retention_period_in_object_storage(s3, tmp_path, monkeypatch):
    from dsc.compiler.upload import push

    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1000000000")
    monkeypatch.setenv("DSC_CACHE_DIR", str(tmp_path / "cache"))
    url = "s3://dsc-doors/pinned-clock"
    push(_two_versions(tmp_path, 6, 2), url, progress=False)
    r = dsc.vacuum(url)  # superseded by the bucket's clock: seconds ago
    assert r.removed == [] and r.recent == [0]
    assert len(dsc.open(url, version=0, cache_dir=tmp_path / "c")) == 6


# --------------------------------------------------------------------------- 10. a damaged object in a bucket
def _objects(m) -> dict:
    """{object path: (sha256, nbytes)} of a manifest's small files."""
    return {V.object_path(f["sha256"]): (f["sha256"], f["nbytes"]) for f in m.files.values()}


def _rot(store, objects: dict) -> None:
    """Put each object in the bucket with one byte flipped (its name and its size unchanged)."""
    for rel, (sha, nbytes) in objects.items():
        good = store.get(rel) if store.stat(rel) else None
        data = bytearray(good if good is not None else b"\0" * nbytes)
        data[-1] ^= 1
        store.put(rel, bytes(data))


@pytest.mark.parametrize("how", ["push", "update"])
def test_a_bit_rotted_object_in_a_bucket_is_not_reused_by_its_name(s3, tmp_path, monkeypatch, how):
    """Objects a new version shares with what is in the bucket (a leftover of an interrupted writer, or one
    damaged since) are reused only when their bytes hash to their name: the version committed verifies and
    reads the same as the local one."""
    from dsc.compiler.upload import push

    monkeypatch.setenv("DSC_CACHE_DIR", str(tmp_path / "cache"))
    url = f"s3://dsc-doors/rotted-{how}"
    src, local = tmp_path / "src", tmp_path / "local.dsc"
    make_folder(src, 12)
    dsc.compile_imagefolder(src, local, workers=1, **OPTS)
    base = tmp_path / "base.dsc"
    shutil.copytree(local, base)
    make_folder(src, 5, seed0=4000)
    dsc.compile_imagefolder(src, local, update=True, workers=1, **OPTS)
    v0, v1 = (_objects(dsc.open(local, version=n).manifest) for n in (0, 1))
    new = {rel: o for rel, o in v1.items() if rel not in v0}
    assert new
    store = open_store_of(url)
    if how == "push":
        push(base, url, progress=False)  # version 0 there, then leftovers of version 1's objects, rotted
        _rot(store, {**new, **v0})  # (version 0's too: a new version reuses them as well)
        push(local, url, progress=False)
    else:
        push(base, url, progress=False)
        _rot(store, new)
        r = dsc.compile_imagefolder(src, url, update=True, workers=1, **OPTS)
        assert r.committed and r.version == 1
        assert set(_objects(dsc.open(url, cache_dir=tmp_path / "c0").manifest)) & set(new)  # (one was reused)
    assert dsc.verify(url).ok
    a, b = dsc.open(url, cache_dir=tmp_path / "c"), dsc.open(local)
    assert len(a) == len(b) == 17 and _labels(a) == _labels(b)
    from click.testing import CliRunner

    from dsc.cli import main

    assert CliRunner().invoke(main, ["verify", url, "-q"]).exit_code == 0
