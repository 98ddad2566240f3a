"""One behaviour, whatever holds the dataset: the same suite against a local folder, S3 (moto), GCS
(fake-gcs-server) and Azure Blob (Azurite), each started on loopback by tests/object_servers.py. Compile,
open and read every sample, update, tag, restore, log, verify, vacuum (a reader's pin or lease keeps its
version), and for object storage the shard cache's warm / ls / clear; then writers racing at one URL."""
import gc
import os
import subprocess
import sys
from pathlib import Path

import pytest

import dsc
from dsc.errors import VersionConflictError, VersionNotFoundError
from dsc.formats import versions as V
from dsc.store import open_store

from object_servers import _FIXTURE, BUCKET, use_server  # noqa: F401  (the fixtures come through conftest.py)
from conftest import samples
from test_versions import make_folder

OPTS = dict(size=16, shard_size=8, workers=1, progress=False)


def child_env() -> dict:
    """The environment for a child process: this one's now (the servers' variables included), dsc importable."""
    return {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
WHERE = ("folder", "s3", "gs", "az")


@pytest.fixture(params=WHERE)
def where(request, monkeypatch, tmp_path) -> str:
    """Where the dataset lives: a folder, or a fresh prefix on one of the three servers."""
    if request.param == "folder":
        return str(tmp_path / "out.dsc")
    pytest.importorskip("obstore")
    server = request.getfixturevalue(_FIXTURE[request.param])
    use_server(server, monkeypatch)
    monkeypatch.setenv("DSC_CACHE_DIR", str(tmp_path / "cache"))
    return f"{request.param}://{BUCKET}/suite-{request.node.callspec.id}-{tmp_path.name}"


def reference(src: Path, tmp_path: Path, name: str) -> dict:
    return samples(dsc.open(dsc.compile_imagefolder(src, tmp_path / name, **OPTS).path))


def test_the_same_behaviour_in_every_store(where, tmp_path):
    src = tmp_path / "src"
    paths = make_folder(src, 24, classes=3)
    v0 = reference(src, tmp_path, "ref0")
    assert str(dsc.compile_imagefolder(src, where, **OPTS).path) == where
    ds = dsc.open(where)
    assert samples(ds) == v0
    served = {ds.keys[i]: (im.numpy().tobytes(), int(label)) for b in dsc.Loader(ds, batch_size=8, order="random")
              for i, im, label in zip(b["index"].tolist(), b["image"], b["label"])}
    assert served == v0  # an epoch of the Loader (in object storage: through the shard cache)

    make_folder(src, 8, classes=3, seed0=900)  # version 1: 8 new images, 2 removed
    for p in paths[:2]:
        p.unlink()
    v1 = reference(src, tmp_path, "ref1")
    r = dsc.compile_imagefolder(src, where, update=True, **OPTS)
    assert r.committed and r.version == 1
    assert samples(dsc.open(where)) == v1 and samples(dsc.open(where, version=0)) == v0

    assert dsc.tag(where, "first", version=0) == 0
    assert samples(dsc.open(where, tag="first")) == v0
    assert dsc.restore(where, tag="first") == 2
    assert samples(dsc.open(where)) == v0
    log = dsc.log(where)
    assert [e["version"] for e in log] == [0, 1, 2] and log[0]["tags"] == ["first"]
    assert log[2]["operation"] == "restore 0"
    for n in (None, 0, 1):
        report = dsc.verify(where, version=n)
        assert report.ok and report.shards_checked > 0, (n, report.problems)

    reader = dsc.open(where, version=1)  # a reader of version 1: its pin (a folder) or lease (a bucket)
    r = dsc.vacuum(where, keep=1, older_than=0)
    assert r.removed == [] and 1 in r.pinned and 0 in r.tagged and 2 in r.kept
    assert samples(reader) == v1
    del reader
    gc.collect()
    dry = dsc.vacuum(where, keep=1, older_than=0, dry_run=True)
    r = dsc.vacuum(where, keep=1, older_than=0)
    assert r.removed == dry.removed == [1] and r.files == dry.files > 0 and r.bytes == dry.bytes
    with pytest.raises(VersionNotFoundError):
        dsc.open(where, version=1)
    assert samples(dsc.open(where)) == v0 and samples(dsc.open(where, version=0)) == v0
    assert dsc.verify(where).ok and dsc.verify(where, version=0).ok
    again = dsc.vacuum(where, keep=1, older_than=0)
    assert again.removed == [] and again.files == 0  # nothing left to remove


def test_the_shard_cache_commands_in_every_object_store(object_store_url, monkeypatch, tmp_path):
    from click.testing import CliRunner

    from dsc.cli import main

    where = object_store_url
    monkeypatch.setenv("DSC_CACHE_DIR", str(tmp_path / "cache"))
    src = tmp_path / "src"
    make_folder(src, 24, classes=3)
    dsc.compile_imagefolder(src, where, **OPTS)
    cache = str(tmp_path / "cli-cache")
    run = lambda *a: CliRunner().invoke(main, [str(x) for x in a])  # noqa: E731
    r = run("cache", "warm", where, "--cache-dir", cache)
    assert r.exit_code == 0 and "3 shards downloaded" in r.output, r.output
    r = run("cache", "ls", "--cache-dir", cache)
    assert r.exit_code == 0 and where in r.output, r.output
    r = run("cache", "clear", where, "--cache-dir", cache)
    assert r.exit_code == 0 and "removed" in r.output, r.output
    r = run("info", where)
    assert r.exit_code == 0 and "samples   24 in 3 shards" in r.output, r.output


# --------------------------------------------------------------------------- writers racing in object storage
RACER = """
import sys, dsc
from dsc.errors import VersionConflictError
try:
    dsc.compile_imagefolder(sys.argv[1], sys.argv[2], update=True, resume=sys.argv[3] == "1", size=16,
                            shard_size=8, workers=1, progress=False, cache_dir=sys.argv[4])
    print("committed")
except VersionConflictError as e:
    print("conflict:", e)
"""


@pytest.mark.parametrize("resume", [False, True])
def test_racing_updates_never_damage_a_committed_version(s3_server, monkeypatch, tmp_path, resume):
    """Two --update runs of different sources at one URL at once, round after round (with and without
    --resume, which a failed update suggests): at most one commits each version, a loser is told and commits
    nothing, no file of a committed version is ever replaced (every version verifies), and an update run
    alone afterwards always succeeds (a loser's leftovers never block it; vacuum removes them)."""
    use_server(s3_server, monkeypatch)
    url = f"s3://{BUCKET}/race-{int(resume)}-{tmp_path.name}"
    base = tmp_path / "base"
    make_folder(base, 16, classes=2)
    dsc.compile_imagefolder(base, url, cache_dir=str(tmp_path / "c0"), **OPTS)
    script = tmp_path / "racer.py"
    script.write_text(RACER)
    env = child_env()
    srcs = []
    for k in range(2):
        src = tmp_path / f"src{k}"
        make_folder(src, 16, classes=2)
        srcs.append(src)
    for rnd in range(3):
        for k, src in enumerate(srcs):  # each racer's source grows by its own images every round
            make_folder(src, 3, classes=2, seed0=1000 * (k + 1) + 10 * rnd)
        procs = [subprocess.Popen([sys.executable, str(script), str(src), url, "1" if resume else "0",
                                   str(tmp_path / f"cache{k}")], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  env=env, text=True) for k, src in enumerate(srcs)]
        outs = [p.communicate(timeout=240) for p in procs]
        for p, (out, err) in zip(procs, outs):
            assert p.returncode == 0 and ("committed" in out or "conflict:" in out), err[-3000:]
        have = V.versions(open_store(url))
        assert have == list(range(len(have)))
        for n in have:
            report = dsc.verify(url, version=n)
            assert report.ok, (rnd, n, report.problems)
    alone = tmp_path / "alone"
    make_folder(alone, 16, classes=2, seed0=5000)
    n_before = V.versions(open_store(url))[-1]
    r = dsc.compile_imagefolder(alone, url, update=True, cache_dir=str(tmp_path / "c9"), **OPTS)
    assert r.committed and r.version == n_before + 1
    assert samples(dsc.open(url)) == reference(alone, tmp_path, "alone-ref")
    vac = dsc.vacuum(url, keep=100, older_than=0)  # every version kept; the losers' leftovers go
    assert vac.removed == [] and all(dsc.verify(url, version=n).ok for n in V.versions(open_store(url)))
    assert dsc.vacuum(url, keep=100, older_than=0).leftovers == 0


def test_a_loser_of_a_commit_race_commits_nothing_and_the_winner_stays_intact(s3_server, monkeypatch, tmp_path):
    """In process, deterministically: writer B commits version 1 while A is about to publish its own version 1.
    A is told and commits nothing; B's version stays intact; A run again applies on top of B's."""
    use_server(s3_server, monkeypatch)
    url = f"s3://{BUCKET}/loser-{tmp_path.name}"
    a, b = tmp_path / "a", tmp_path / "b"
    make_folder(a, 16, classes=2)
    dsc.compile_imagefolder(a, url, cache_dir=str(tmp_path / "c"), **OPTS)
    make_folder(b, 20, classes=2, seed0=300)
    make_folder(a, 4, classes=2, seed0=700)
    real, done = V.commit, []

    def b_first(store, record):  # A's update commits in its local staging, then publishes: B runs meanwhile
        if not done:
            done.append("running")
            done[0] = dsc.compile_imagefolder(b, url, update=True, cache_dir=str(tmp_path / "cb"), **OPTS)
        return real(store, record)
    monkeypatch.setattr(V, "commit", b_first)
    with pytest.raises(VersionConflictError, match="another writer committed it meanwhile: nothing of this update"):
        dsc.compile_imagefolder(a, url, update=True, cache_dir=str(tmp_path / "ca"), **OPTS)
    monkeypatch.setattr(V, "commit", real)
    assert done[0].version == 1 and samples(dsc.open(url)) == reference(b, tmp_path, "refb")
    assert dsc.verify(url).ok  # (A saw B's record before sending anything: it left nothing behind either)
    assert dsc.vacuum(url, keep=5, older_than=0, dry_run=True).leftovers == 0
    r = dsc.compile_imagefolder(a, url, update=True, cache_dir=str(tmp_path / "ca2"), **OPTS)
    assert r.version == 2 and samples(dsc.open(url)) == reference(a, tmp_path, "refa")
    assert dsc.verify(url).ok and dsc.verify(url, version=1).ok


def test_an_upload_never_replaces_a_file_that_is_not_its_own(s3_server, monkeypatch, tmp_path):
    """What made racing `--update --resume` runs damage a committed version: the loser, resuming, replaced a
    shard the winner had committed. An upload now creates files only (a conditional put); a file there is
    kept only when it is the same content-addressed object, or the same shard this writer itself uploaded
    (its token, kept beside its staging): a resumed writer reuses its own work and nothing else."""
    from dsc.compiler.upload import Uploader

    use_server(s3_server, monkeypatch)
    url = f"s3://{BUCKET}/own-{tmp_path.name}"
    store = open_store(url)
    mine, theirs = tmp_path / "mine", tmp_path / "theirs"
    for folder, data in ((mine, b"my shard bytes"), (theirs, b"a committed shard")):
        (folder / "image/c/5/0/0").mkdir(parents=True)
        (folder / "image/c/5/0/0/0").write_bytes(data)
    import hashlib

    sha = {k: hashlib.sha256((f / "image/c/5/0/0/0").read_bytes()).hexdigest() for k, f in (("m", mine), ("t", theirs))}
    a = Uploader(store, writer="winner")
    a.submit([theirs], "image/c/5/0/0/0", sha["t"], 17).result()
    a.close()
    b = Uploader(store, writer="loser")
    with pytest.raises(VersionConflictError, match="never overwrites"):
        b.submit([mine], "image/c/5/0/0/0", sha["m"], 14).result()
    with pytest.raises(VersionConflictError, match="never overwrites"):  # the same bytes, another writer's: not ours
        b.submit([theirs], "image/c/5/0/0/0", sha["t"], 17).result()
    b.close()
    assert store.get("image/c/5/0/0/0") == b"a committed shard"
    again = Uploader(store, writer="winner")  # the winner resuming: its own shard is kept, not sent again
    again.submit([theirs], "image/c/5/0/0/0", sha["t"], 17).result()
    assert again.kept == 1 and again.sent == 0
    again.close()


# --------------------------------------------------------------------------- one cache, several processes
SHARER = """
import sys, dsc
import dsc.runtime.cache
dsc.runtime.cache.WAIT_SECONDS = 20.0  # a wait for room this long fails the process (it was 60 s before the fix)
ds = dsc.open(sys.argv[1], version=int(sys.argv[2]), cache_dir=sys.argv[3], cache_limit=int(sys.argv[4]))
seen = set()
with dsc.Loader(ds, batch_size=8, order="quasi_random", window=2, seed=int(sys.argv[2])) as loader:
    for epoch in range(6):
        for b in loader:
            seen.update(b["index"].tolist())
ds.close()
print(len(seen), len(ds))
"""


def test_two_processes_on_one_small_cache_both_finish(s3_server, monkeypatch, tmp_path):
    """Two processes reading two versions of one dataset through one cache of ~10 shards (each needs a few
    at once): each gets a share of the limit and lets idle shards go when the other waits, so both finish
    (before, both waited 60 s and failed with CacheFullError); demands that cannot fit together fail at once."""
    use_server(s3_server, monkeypatch)
    url = f"s3://{BUCKET}/shared-{tmp_path.name}"
    src = tmp_path / "src"
    make_folder(src, 120, classes=3)
    dsc.compile_imagefolder(src, url, cache_dir=str(tmp_path / "c0"), **OPTS)
    for p in sorted(src.rglob("*.jpg"))[::2]:  # version 1: half the images replaced (other shards)
        p.unlink()
    make_folder(src, 60, classes=3, seed0=500)
    dsc.compile_imagefolder(src, url, update=True, cache_dir=str(tmp_path / "c1"), **OPTS)
    shard = max(s.nbytes for s in dsc.open(url, cache_dir=tmp_path / "p").manifest.shards if s is not None)
    script = tmp_path / "sharer.py"
    script.write_text(SHARER)
    env = child_env()
    cache = tmp_path / "shared-cache"
    procs = [subprocess.Popen([sys.executable, str(script), url, str(v), str(cache), str(10 * shard)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True) for v in (0, 1)]
    outs = [p.communicate(timeout=240) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err[-3000:]
        seen, n = out.split()
        assert seen == n, out  # every sample
    from dsc.runtime.cache import ShardCache, cache_users

    assert ShardCache(cache).usage() <= 10 * shard and cache_users(cache) == []  # closed: no user left
    from dsc.runtime import cache as C
    from dsc.runtime.cache import CacheUser

    monkeypatch.setattr(C, "WAIT_SECONDS", 0.5)  # (a wait for room would end in another error than the one asked)
    other = CacheUser(cache)  # another process reading through the cache, needing 9 shards at once
    other.need(9 * shard)
    with dsc.open(url, cache_dir=cache, cache_limit=10 * shard) as ds:
        loader = dsc.Loader(ds, batch_size=8, order="sequential")  # needs 2 or 3: 11 or 12 > 10 do not fit
        with pytest.raises(dsc.errors.CacheFullError, match=r"cache_limit .* smaller than what the 2 processes"):
            next(iter(loader))  # at once, declared needs against the limit: not after a wait for room
        loader.close()
    other.close()
    assert cache_users(cache) == []


def test_a_writer_killed_mid_upload_never_blocks_the_next_one(s3_server, monkeypatch, tmp_path):
    """An update killed after some of its shards were uploaded (kill -9 of a remote writer) leaves files no
    version references: the next update, with or without --resume, writes past them and commits; vacuum
    removes them once they are older than --older-than."""
    use_server(s3_server, monkeypatch)
    url = f"s3://{BUCKET}/killed-{tmp_path.name}"
    src = tmp_path / "src"
    make_folder(src, 16, classes=2)
    dsc.compile_imagefolder(src, url, cache_dir=str(tmp_path / "c"), **OPTS)
    make_folder(src, 24, classes=2, seed0=100)
    script = tmp_path / "killed.py"
    script.write_text(f"""
import os, sys, dsc
from dsc.compiler import upload
real = upload.Uploader._one
count = [0]
def one(self, *a, **k):
    real(self, *a, **k)
    count[0] += 1
    if count[0] == 2:  # two files of the new version are in the bucket: the writer dies here
        os.kill(os.getpid(), 9)
upload.Uploader._one = one
dsc.compile_imagefolder({str(src)!r}, {url!r}, update=True, size=16, shard_size=8, workers=1, progress=False,
                        cache_dir={str(tmp_path / 'ck')!r})
""")
    env = child_env()
    r = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=180)
    assert r.returncode == -9, r.stderr[-2000:]
    assert V.versions(open_store(url)) == [0]
    left = dsc.vacuum(url, keep=5, older_than=0, dry_run=True).leftovers
    assert left >= 2  # what the killed writer sent
    for resume in (True, False):
        r = dsc.compile_imagefolder(src, url, update=True, resume=resume, cache_dir=str(tmp_path / f"c{resume}"),
                                    **OPTS)
        assert r.committed, resume
        make_folder(src, 8, classes=2, seed0=300 + 10 * resume)
    assert V.versions(open_store(url)) == [0, 1, 2]
    assert all(dsc.verify(url, version=n).ok for n in (0, 1, 2))
    assert dsc.vacuum(url, keep=5, older_than=0).leftovers == left
    assert dsc.vacuum(url, keep=5, older_than=0).leftovers == 0 and dsc.verify(url).ok


# --------------------------------------------------------------------------- from the review of this layer
def test_a_vacuum_and_a_writer_never_run_together_in_object_storage(s3_server, monkeypatch, tmp_path):
    """No flock in a bucket: writers (tag, restore, update, push, compile) and a vacuum each hold a lease
    (_dsc/writers/); a vacuum does not start beside a live writer, nor a writer beside a live vacuum (before,
    a restore or a tag landing in a running vacuum lost their version's files); a dead local writer's lease
    does not block; a change that slips past is caught before anything is deleted."""
    from dsc.errors import CompileLockedError
    from dsc.store.object import WriterLease

    use_server(s3_server, monkeypatch)
    monkeypatch.setenv("DSC_CACHE_DIR", str(tmp_path / "default-cache"))
    url = f"s3://{BUCKET}/excl-{tmp_path.name}"
    src = tmp_path / "src"
    make_folder(src, 16, classes=2)
    dsc.compile_imagefolder(src, url, cache_dir=str(tmp_path / "c"), **OPTS)
    make_folder(src, 8, classes=2, seed0=100)
    dsc.compile_imagefolder(src, url, update=True, cache_dir=str(tmp_path / "c"), **OPTS)
    # the update published under its own lease, with its staging's token: nothing of it is left in any cache
    assert not (tmp_path / "default-cache").exists() and not list((tmp_path / "c").rglob("writer-*"))
    store = open_store(url)
    with WriterLease(store, "update"):  # a writer at work (elsewhere)
        with pytest.raises(CompileLockedError, match="a vacuum does not run beside a writer"):
            dsc.vacuum(url, older_than=0)
    assert V.versions(store) == [0, 1]
    with WriterLease(store, "vacuum"):
        for write in (lambda: dsc.tag(url, "t", version=0), lambda: dsc.restore(url, version=0)):
            with pytest.raises(CompileLockedError, match="vacuum"):
                write()
    assert not store.list("_dsc/writers/")  # every lease let go
    dead = WriterLease(store, "update")
    dead.__enter__()
    store.put(dead.rel, store.get(dead.rel).replace(str(os.getpid()).encode(), b"999999"))
    dead.rel = None  # (a writer of this machine that was killed: its process is gone)
    assert dsc.vacuum(url, keep=1, older_than=0).removed == [0]
    assert not store.list("_dsc/writers/")

    real, hooked = V.read_tags, []

    def a_tag_lands_meanwhile(where):  # past the leases: a tag written by hand while vacuum decides
        out = real(where)
        if not hooked:
            hooked.append(open_store(url).put(f"{V.TAGS}/late.json", b'{"version": 1, "created": "x"}\n'))
        return out
    make_folder(src, 4, classes=2, seed0=200)
    dsc.compile_imagefolder(src, url, update=True, cache_dir=str(tmp_path / "c"), **OPTS)
    monkeypatch.setattr(V, "read_tags", a_tag_lands_meanwhile)
    with pytest.raises(VersionConflictError, match="changed while vacuum decided"):
        dsc.vacuum(url, keep=1, older_than=0)
    monkeypatch.setattr(V, "read_tags", real)
    assert V.versions(store) == [1, 2] and dsc.verify(url, version=1).ok


def test_a_local_vacuum_works_on_the_folder_at_the_path_once_it_holds_the_lock(tmp_path, monkeypatch):
    """A folder moved away and another compiled at its path just before the vacuum took the lock: the vacuum
    reads and deletes in the same (new) folder; the moved one keeps its versions."""
    import os

    out = tmp_path / "out.dsc"
    src, other = tmp_path / "src", tmp_path / "other"
    make_folder(src, 16, classes=2)
    dsc.compile_imagefolder(src, out, **OPTS)
    make_folder(src, 8, classes=2, seed0=50)
    dsc.compile_imagefolder(src, out, update=True, **OPTS)
    make_folder(other, 16, classes=2, seed0=500)
    from dsc.store.local import OutLock

    real_enter, moved = OutLock.__enter__, []

    def enter(self):
        if not moved:  # the user swaps the dataset at the path, then the vacuum gets its lock
            moved.append(os.rename(out, tmp_path / "backup.dsc"))
            dsc.compile_imagefolder(other, out, **OPTS)
        return real_enter(self)
    monkeypatch.setattr(OutLock, "__enter__", enter)
    r = dsc.vacuum(out, keep=1, older_than=0)
    monkeypatch.setattr(OutLock, "__enter__", real_enter)
    assert r.removed == [] and V.versions(out) == [0] and dsc.verify(out).ok
    assert V.versions(tmp_path / "backup.dsc") == [0, 1] and dsc.verify(tmp_path / "backup.dsc").ok


def test_a_dead_waiters_ticket_never_blocks_the_cache(tmp_path, monkeypatch):
    """A process killed while it waited for room leaves its ticket; whatever its process id became since,
    the next waiter is served as soon as there is room (waiters hold a lock on their tickets)."""
    import hashlib

    from dsc.runtime import cache as C

    monkeypatch.setattr(C, "WAIT_SECONDS", 8.0)  # (blocked behind the dead ticket: CacheFullError after 8 s)
    c = C.ShardCache(tmp_path / "cache", 100)

    def fetcher(data):
        def fetch(f, on_chunk):
            on_chunk(None)
            f.write(data)
            on_chunk(memoryview(data))
            f.truncate()
            return len(data)
        return fetch

    a, b = b"a" * 80, b"b" * 80
    held = c.hold(hashlib.sha256(a).hexdigest(), 80, fetcher(a), "A")
    (c.root / "queue").mkdir(exist_ok=True)
    (c.root / "queue" / f"{1:020d}-1-1").touch()  # a dead waiter's ticket, its pid (1) alive
    import threading

    threading.Timer(0.2, held.close).start()
    c.hold(hashlib.sha256(b).hexdigest(), 80, fetcher(b), "B").close()  # served once A is let go


def test_a_duration_says_its_unit():
    """`--older-than 7` was read as 7 seconds (and removed versions a user meant to keep for 7 days)."""
    from dsc.errors import ConfigError
    from dsc.versions import parse_duration

    assert parse_duration("7d") == 7 * 86400 and parse_duration("0") == 0 and parse_duration("12h") == 43200
    for bad in ("7", "1.5", "-1d", "7 days"):
        with pytest.raises(ConfigError, match="a duration is a number with s, m, h, d or w"):
            parse_duration(bad)


def test_s3_puts_are_not_hashed_again_to_sign_them(monkeypatch):
    """Over https and plain http the S3 client signs UNSIGNED-PAYLOAD and sends a CRC64-NVME checksum the server
    verifies (a shard's bytes are not hashed a second time: dsc hashed them as it wrote them). With
    AWS_UNSIGNED_PAYLOAD or AWS_CHECKSUM_ALGORITHM set by the user, obstore's own reading of them stands
    (tests/test_remote_cost.py checks the requests themselves)."""
    pytest.importorskip("obstore")
    for k in ("AWS_UNSIGNED_PAYLOAD", "AWS_CHECKSUM_ALGORITHM", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "k")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s")
    for endpoint in ("https://s3.example.invalid", "http://127.0.0.1:9"):
        monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
        config = open_store("s3://b/ds")._store.config
        assert config.get("unsigned_payload") == "true" and config.get("checksum_algorithm") == "crc64nvme"
    monkeypatch.setenv("AWS_UNSIGNED_PAYLOAD", "false")
    monkeypatch.setenv("AWS_CHECKSUM_ALGORITHM", "sha256")
    config = open_store("s3://b/ds")._store.config
    assert "unsigned_payload" not in config and "checksum_algorithm" not in config


def test_an_objects_last_bytes_and_identity_in_every_object_store(object_store_url):
    """``read_tail`` (a Parquet footer's first read): the object's last bytes and its size and ETag, by one suffix GET
    where the store takes one, by a HEAD and a range on Azure Blob (which takes no suffix range); all of a small
    object; nothing of an empty one (no suffix range to answer: the HEAD's way); FileNotFoundError for none."""
    store = open_store(object_store_url)
    data = bytes(range(256)) * 1000
    store.put("t.bin", data)
    tail, (size, mtime, etag) = store.read_tail("t.bin", 1000)
    assert bytes(tail) == data[-1000:] and size == len(data) and etag and mtime > 0
    assert store.identity("t.bin")[2] == etag
    assert bytes(store.read_tail("t.bin", 10 ** 6)[0]) == data
    store.put("empty.bin", b"")  # (no last bytes: S3 answers a suffix range of it 416, GCS and Azure the whole 0)
    tail, (size, mtime, etag) = store.read_tail("empty.bin", 1000)
    assert bytes(tail) == b"" and size == 0 and etag == store.identity("empty.bin")[2]
    with pytest.raises(FileNotFoundError):
        store.read_tail("none.bin", 1000)
