"""Remote datasets against a real S3 API server (moto's server mode on loopback, started here; no client mock):
compile to s3://, epochs through a cache bounded at 30% of the dataset, two processes sharing a cache,
the server stopped and restarted mid-epoch, stopped for good, a corrupted shard, resume of an upload,
versions in object storage, the CLI."""
import json
import os
import pickle
import subprocess
import sys
import textwrap
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("obstore")
pytest.importorskip("moto.server")

import dsc  # noqa: E402
from dsc.errors import (ConfigError, CorruptDatasetError, CredentialsError, DscError, OutputExistsError,  # noqa: E402
                        RemoteError, VersionConflictError)
from dsc.formats import versions as V  # noqa: E402
from dsc.store import is_url, open_store  # noqa: E402
from dsc.store.object import aws_files_config  # noqa: E402

from dsc.runtime.cache import ShardCache, parse_size  # noqa: E402

from object_servers import S3, free_port, use_server  # noqa: E402  (the moto server, shared with test_object_servers.py)
from conftest import samples  # noqa: E402
from test_versions import make_folder  # noqa: E402

OPTS = dict(size=16, shard_size=16, progress=False)


@pytest.fixture(scope="module")
def s3(s3_server):
    """The session's S3 server with bucket dsc-test, its variables set for this module (dsc's own defaults:
    no DSC_CACHE_DIR, the 120 s retry budget)."""
    with pytest.MonkeyPatch.context() as m:
        use_server(s3_server, m)
        m.delenv("DSC_RETRY_SECONDS", raising=False)
        m.delenv("DSC_CACHE_DIR", raising=False)
        s3_server.bucket("dsc-test")
        yield s3_server


@pytest.fixture(scope="module")
def src(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("remote-src") / "src"
    make_folder(root, 300)
    return root


@pytest.fixture(scope="module")
def published(s3, src, tmp_path_factory):
    """(url, the same dataset compiled locally): 300 images in 19 shards of 16."""
    url = "s3://dsc-test/folder300"
    report = dsc.compile_imagefolder(src, url, workers=2, cache_dir=str(tmp_path_factory.mktemp("stage")), **OPTS)
    assert report.path == url
    local = tmp_path_factory.mktemp("remote-local") / "local.dsc"
    dsc.compile_imagefolder(src, local, workers=2, **OPTS)
    return url, local


def epoch(loader) -> dict:
    """{index: (pixels, label)} of one epoch; an index served twice fails."""
    seen = {}
    for b in loader:
        for i, im, lab in zip(b["index"].tolist(), b["image"], b["label"].tolist()):
            assert i not in seen, f"sample {i} served twice"
            seen[i] = (im.numpy().tobytes(), lab)
    return seen


def dataset_bytes(local) -> int:
    return sum(s.nbytes for s in dsc.open(local).manifest.shards)


class UsageWatch:
    """Samples the cache's bytes (under its lock) while an epoch runs."""

    def __init__(self, cache_dir):
        self.cache = ShardCache(cache_dir)
        self.peak = 0
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, self.cache.usage())
            self.samples += 1
            time.sleep(0.001)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


# --------------------------------------------------------------------------- acceptance
def test_compile_to_s3_and_epochs_through_a_cache_of_30_percent(published, tmp_path):
    url, local = published
    store = open_store(url)
    assert store.get_or_none(V.record_path(0)) is not None and store.get_or_none("zarr.json") is not None
    ref_ds = dsc.open(local)
    ref = ref_ds.get_batch(range(len(ref_ds)))
    limit = int(dataset_bytes(local) * 0.3)
    ds = dsc.open(url, cache_dir=tmp_path / "cache", cache_limit=limit)
    assert len(ds) == 300 and ds.keys == ref_ds.keys and ds.classes == ref_ds.classes
    assert ds.storage.cache.downloads == 0  # open fetched the small arrays only
    for order, kw in (("quasi_random", dict(batch_size=16, window=2)), ("random", dict(batch_size=4))):
        with UsageWatch(tmp_path / "cache") as watch:
            if order == "random":
                with pytest.warns(UserWarning, match="quasi_random"):
                    seen = epoch(dsc.Loader(ds, order=order, seed=3, **kw))
            else:
                seen = epoch(dsc.Loader(ds, order=order, seed=3, **kw))
        assert sorted(seen) == list(range(300)), order
        for i, (px, lab) in seen.items():
            assert px == ref["image"][i].numpy().tobytes() and lab == int(ref["label"][i]), (order, i)
        assert watch.samples > 10 and 0 < watch.peak <= limit, (order, watch.peak, limit)
    assert ShardCache(tmp_path / "cache").usage() <= limit


def test_the_bucket_is_a_plain_zarr_group(published, tmp_path):
    """What the bucket holds under the URL is a Zarr v3 group: copied as it is, zarr-python opens it."""
    zarr = pytest.importorskip("zarr")
    url, local = published
    store = open_store(url)
    for rel, _ in store.list(""):
        if not rel.startswith("_dsc/"):
            (tmp_path / "copy" / rel).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / "copy" / rel).write_bytes(store.get(rel))
    g = zarr.open_group(tmp_path / "copy", mode="r")
    assert np.array_equal(g["label"][:], dsc.open(local).labels.numpy())
    assert np.array_equal(g["image"][5], dsc.open(local)[5]["image"].numpy())


def test_open_fetches_only_small_arrays_and_a_sample_maps_from_the_cache(published, tmp_path):
    url, local = published
    ds = dsc.open(url, cache_dir=tmp_path / "c")
    assert ds.remote and not dsc.open(local).remote
    assert not list((tmp_path / "c" / "shards").rglob("*"))
    assert ds[5]["image"].numpy().tobytes() == dsc.open(local)[5]["image"].numpy().tobytes()
    assert ds.storage.cache.downloads == 1
    for i in range(0, 300, 16):  # unbounded cache: every shard stays mapped, as a local dataset's
        ds[i]
    assert len(ds.storage._held) == 19
    bounded = dsc.open(url, cache_dir=tmp_path / "c", cache_limit=8 * 12548)
    for i in range(0, 300, 16):  # bounded: shards no batch needs are let go beyond a quarter of the limit
        bounded[i]
        assert sum(h.nbytes for h in bounded.storage._held.values()) <= bounded.storage.idle_budget


@pytest.mark.parametrize("read", ["mapped", "windowed", "direct"])
def test_every_read_strategy_reads_the_cached_shards(published, tmp_path, read):
    """Remote datasets read through the local strategies from the cache; a warm epoch (every shard cached and
    held) schedules nothing: no fetch thread, no download, no per-batch bookkeeping."""
    url, local = published
    ref = samples(dsc.open(local))
    keys = dsc.open(local).keys
    ds = dsc.open(url, cache_dir=tmp_path / "c")
    loader = dsc.Loader(ds, batch_size=20, order="random", seed=1, read=read)
    for e in range(2):
        loader.set_epoch(e)
        it = iter(loader)
        feed = it._state.feed
        seen = epoch(it)
        assert {keys[i]: v for i, v in seen.items()} == ref
        if e == 1 and read != "windowed":  # (windowed maps and lets go of the cached files every epoch)
            assert feed.thread is None and feed.ready == len(loader), read  # warm: everything ready at once
    assert ds.storage.cache.downloads == 19
    if read == "direct":
        assert loader._reads.reads > 0 and not ds.storage._maps  # read from the cache files, nothing mapped
    loader.close()
    bounded = dsc.open(url, cache_dir=tmp_path / "b", cache_limit=int(dataset_bytes(local) * 0.4))
    loader = dsc.Loader(bounded, batch_size=16, order="quasi_random", window=2, seed=2, read=read)
    for e in range(2):
        loader.set_epoch(e)
        seen = epoch(loader)
        assert {keys[i]: v for i, v in seen.items()} == ref
        assert _evicted_but_open(tmp_path / "b") == 0  # nothing keeps evicted shards' bytes on disk
    if read == "windowed":  # the cached files are mapped by the strategy, within its budget, and let go
        assert 0 < loader._reads.peak_bytes <= loader._reads.budget and loader._reads.held_bytes == 0
        assert not bounded.storage._maps
    loader.close()


def _evicted_but_open(cache_dir) -> int:
    """Descriptors of this process on files of the cache that were deleted (evicted)."""
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        n += str(cache_dir) in target and target.endswith("(deleted)")
    return n


def test_a_pickled_handle_reopens_the_same_version_without_the_network(published, tmp_path, s3):
    url, local = published
    ds = dsc.open(url, cache_dir=tmp_path / "c")
    want = ds[17]["image"].numpy().tobytes()
    ds.storage.close()
    clone = pickle.loads(pickle.dumps(ds))
    assert clone.storage.version == 0 and clone.storage._failed is None
    assert clone[17]["image"].numpy().tobytes() == want  # the shard is cached: no request at all


def test_two_processes_sharing_a_cache_download_each_shard_once(published, tmp_path):
    url, _ = published
    script = textwrap.dedent(f"""
        import json, sys, dsc
        ds = dsc.open({url!r}, cache_dir={str(tmp_path / 'shared')!r})
        seen = set()
        for b in dsc.Loader(ds, batch_size=32, order="sequential"):
            seen.update(b["index"].tolist())
        print(json.dumps({{"downloads": ds.storage.cache.downloads, "samples": len(seen)}}))
    """)
    procs = [subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              env={**os.environ, "PYTHONPATH": os.pathsep.join([os.getcwd(), *sys.path])})
             for _ in range(2)]
    outs = [p.communicate(timeout=180) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err.decode()[-2000:]
    results = [json.loads(out.decode().strip().splitlines()[-1]) for out, _ in outs]
    assert all(r["samples"] == 300 for r in results)
    assert sum(r["downloads"] for r in results) == 19, results  # 19 shards, each fetched by one process only


# --------------------------------------------------------------------------- faults
@pytest.fixture
def own_server(s3, src, tmp_path):
    """A second server (own port) holding a copy of the dataset, to stop and start at will."""
    server = S3()
    url = server.bucket(f"faults-{next(_BUCKETS)}") + "/ds"  # (moto keeps its buckets for the whole process)
    saved = os.environ["AWS_ENDPOINT_URL"]
    os.environ["AWS_ENDPOINT_URL"] = server.endpoint
    try:
        dsc.compile_imagefolder(src, url, workers=1, cache_dir=str(tmp_path / "stage"), **OPTS)
        yield server, url
    finally:
        for _ in range(600):  # downloads a closed Loader left in flight end on their own (server still up)
            if not [t for t in threading.enumerate() if t.name.startswith("dsc-fetch")]:
                break
            time.sleep(0.05)
        os.environ["AWS_ENDPOINT_URL"] = saved
        try:
            server.stop()
        except Exception:
            pass


_BUCKETS = iter(range(10 ** 6))


def loader_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith(("dsc-loader", "dsc-feed", "dsc-fetch"))]


def test_server_restarted_within_the_retry_budget_the_epoch_completes(own_server, tmp_path):
    server, url = own_server
    ds = dsc.open(url, cache_dir=tmp_path / "c", cache_limit=3 * 12548, retry_seconds=60)
    loader = dsc.Loader(ds, batch_size=16, order="sequential", prefetch=1)
    seen = set()
    restarted = threading.Event()
    with pytest.warns(RuntimeWarning, match="retrying for up to .* more \\(DSC_RETRY_SECONDS sets how long"):  # it says it waits, it does not just hang
        for k, b in enumerate(loader):
            seen.update(b["index"].tolist())
            if k == 3:
                server.stop()
                threading.Timer(2.0, lambda: (server.start(), restarted.set())).start()
    assert restarted.is_set() and seen == set(range(300))


def test_server_gone_for_good_a_clear_error_no_hang(own_server, tmp_path):
    server, url = own_server
    ds = dsc.open(url, cache_dir=tmp_path / "c", cache_limit=3 * 12548, retry_seconds=2)
    loader = dsc.Loader(ds, batch_size=16, order="sequential", prefetch=1)
    t0 = time.monotonic()
    with pytest.raises(RemoteError, match=rf"{url}/image/c/\d+") as e, pytest.warns(RuntimeWarning):
        for k, _ in enumerate(loader):
            if k == 2:
                server.stop()
    assert time.monotonic() - t0 < 60 and "after" in str(e.value)
    loader.close()
    for _ in range(100):
        if not loader_threads():
            break
        time.sleep(0.05)
    assert loader_threads() == []


def test_a_corrupted_shard_is_detected_and_named(own_server, tmp_path):
    server, url = own_server
    store = open_store(url)
    rel = "image/c/3/0/0/0"
    good = store.get(rel)
    store.put(rel, bytes(b ^ 0xFF for b in good[:100]) + good[100:])
    ds = dsc.open(url, cache_dir=tmp_path / "c", retry_seconds=5)  # (in-flight downloads outlive the server)
    with pytest.raises(CorruptDatasetError, match=rf"{url}/image/c/3/0/0/0: downloaded twice"):
        epoch(dsc.Loader(ds, batch_size=16))
    for _ in range(200):  # downloads in flight when the epoch stopped finish on their own, then none is left
        if not list((tmp_path / "c" / "shards").rglob("*.part")):
            break
        time.sleep(0.05)
    assert not list((tmp_path / "c" / "shards").rglob("*.part"))
    report = dsc.verify(url)  # the same checks as a folder's: the file, and which samples are damaged
    assert [p.file for p in report.problems] == [rel] and report.problems[0].samples


def test_a_missing_bucket_is_named(s3, tmp_path):
    with pytest.raises(dsc.DatasetNotFoundError, match="the bucket 'no-such-bucket' does not exist"):
        dsc.open("s3://no-such-bucket/ds", cache_dir=tmp_path / "c")


def test_torch_dataloader_workers(published, tmp_path):
    """Forked workers read cached shards and refuse (never hang) to download; spawned ones download."""
    import torch

    url, local = published
    ds = dsc.open(url, cache_dir=tmp_path / "cold")
    forked = torch.utils.data.DataLoader(ds, batch_size=50, num_workers=1, collate_fn=dsc.collate,
                                         multiprocessing_context="fork")
    with pytest.raises(Exception, match="forked from one that had already used object storage"):
        next(iter(forked))
    want = samples(dsc.open(local))
    for context in ("spawn", "fork"):  # spawn downloads (re-opening from the local copy); fork then reads the cache
        loader = torch.utils.data.DataLoader(ds, batch_size=50, num_workers=1, collate_fn=dsc.collate,
                                             multiprocessing_context=context)
        got = {}
        for b in loader:
            for i, im, lab in zip(b["index"].tolist(), b["image"], b["label"].tolist()):
                got[ds.keys[i]] = (im.numpy().tobytes(), lab)
        assert got == want, context


def test_missing_credentials_name_the_variables(s3, tmp_path, monkeypatch):
    """A server that enforces authentication (moto with INITIAL_NO_AUTH_ACTION_COUNT=0, its own process)."""
    port = free_port()
    env = {**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": "0"}
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(200):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/moto-api/", timeout=1)
                break
            except OSError:
                time.sleep(0.05)
        monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{port}")
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", "no-such-key")
        with pytest.raises(CredentialsError, match="AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"):
            dsc.open("s3://locked/ds", cache_dir=tmp_path / "c", retry_seconds=2)
    finally:
        proc.kill()
        proc.wait()


def test_cache_limit_too_small_for_one_batch_is_refused(published, tmp_path):
    url, _ = published
    ds = dsc.open(url, cache_dir=tmp_path / "c", cache_limit="20kB")
    with pytest.raises(ConfigError, match="smaller than the shards batch.*read='ranged'"):
        next(iter(dsc.Loader(ds, batch_size=64, read="direct")))
    loader = dsc.Loader(ds, batch_size=64)  # (left to choose: it reads by ranges)
    assert loader.read_strategy == "ranged" and "cannot hold the shards of a batch" in loader.read_reason
    assert len(next(iter(loader))["image"]) == 64
    with pytest.raises(DscError, match="more than the whole cache_limit"):
        dsc.open(url, cache_dir=tmp_path / "d", cache_limit="1kB")[0]


# --------------------------------------------------------------------------- compile to a URL
def test_an_interrupted_upload_resumes_reusing_uploaded_shards(s3, src, tmp_path, monkeypatch):
    from dsc.store import object as object_store

    url = "s3://dsc-test/resumed"
    puts = []
    real_put = object_store.ObjectStore.put

    def failing_put(self, rel, data, create_only=False, attributes=None):
        puts.append(rel)
        if rel == V.record_path(0) and fail[0]:
            raise object_store.RemoteError(f"{self.where(rel)}: writing failed: simulated outage")
        return real_put(self, rel, data, create_only, attributes)

    fail = [True]
    monkeypatch.setattr(object_store.ObjectStore, "put", failing_put)
    with pytest.raises(RemoteError, match="simulated outage"):
        dsc.compile_imagefolder(src, url, cache_dir=str(tmp_path), workers=1, **OPTS)
    with pytest.raises(DscError):  # nothing is published: no version record
        dsc.open(url, cache_dir=tmp_path / "c")
    shard_puts = [p for p in puts if p.startswith("image/c/")]
    puts_before = list(puts)
    assert len(shard_puts) == 19
    fail[0] = False
    puts.clear()
    from click.testing import CliRunner

    from dsc.cli import main

    r = CliRunner().invoke(main, ["compile", "imagefolder", str(src), url, "--size", "16", "--shard-size", "16",
                                  "--workers", "1", "-q", "--resume", "--cache-dir", str(tmp_path)])
    assert r.exit_code == 0, r.output
    assert not [p for p in puts if p.startswith("image/c/")]  # every shard kept: same size and SHA-256
    kept = len([p for p in shard_puts + [p for p in puts_before if p.startswith(V.OBJECTS)]])
    assert f"uploaded 0 files (0.0 kB); {kept} files were in the bucket already (same SHA-256)" in r.output, r.output
    assert V.record_path(0) in puts
    from dsc.compiler.upload import unstaged

    unstaged()  # (the staging is removed on a thread once the dataset is published: waited for here)
    assert not (tmp_path / "uploads").exists() or not any((tmp_path / "uploads").iterdir())
    ds = dsc.open(url, cache_dir=tmp_path / "c")
    assert len(ds) == 300


def test_a_compile_to_a_url_returns_while_its_staging_is_removed(s3, src, tmp_path, monkeypatch):
    """Once the dataset is published, its local staging is renamed aside and removed on a thread: the compile
    returns without waiting for the unlinks (each of a flushed file waits for the filesystem's journal: a second
    for a compile's ~100 files under load, which a local compile, renaming its staging into place, never pays).
    A folder set aside by a process killed before removing it is removed by the next compile staging there."""
    import shutil
    import threading

    from dsc.compiler import upload

    release, removing = threading.Event(), []
    real = shutil.rmtree

    def slow_rmtree(path, *a, **k):
        if upload.GONE in str(path) and str(tmp_path) in str(path):  # (this test's: no other test's thread)
            removing.append(path)
            release.wait(10)
        return real(path, *a, **k)
    upload.unstaged()  # (an earlier test's removals done)
    monkeypatch.setattr(upload.shutil, "rmtree", slow_rmtree)
    url = "s3://dsc-test/unstaged-behind"
    r = dsc.compile_imagefolder(src, url, cache_dir=str(tmp_path), workers=1, **OPTS)
    assert r.path == url and len(removing) == 1 and not release.is_set()  # returned while it is removed
    (root,) = (tmp_path / "uploads").iterdir()
    assert [p.name for p in root.iterdir() if p.name == "dataset"] == []  # (its name free at once)
    release.set()
    upload.unstaged()
    assert not any((tmp_path / "uploads").iterdir())
    left = tmp_path / "uploads" / root.name / f"{upload.GONE}dataset-dead"  # (a killed process's)
    (left / "image").mkdir(parents=True)
    monkeypatch.setattr(upload.shutil, "rmtree", real)
    with pytest.raises(OutputExistsError):  # (a run that stages under that folder: refused here, after staging)
        dsc.compile_imagefolder(src, url, cache_dir=str(tmp_path), workers=1, **OPTS)
    assert not left.exists()


def test_compile_to_an_existing_url_is_refused(published, src, tmp_path):
    url, _ = published
    with pytest.raises(OutputExistsError, match="already holds a dsc dataset"):
        dsc.compile_imagefolder(src, url, cache_dir=str(tmp_path), **OPTS)
    with pytest.raises(ConfigError, match="--overwrite of a dataset in object storage"):
        dsc.compile_imagefolder(src, url, cache_dir=str(tmp_path), overwrite=True, **OPTS)


def test_update_in_object_storage_uploads_only_the_new_version(s3, tmp_path, monkeypatch):
    """--update of a URL: the base is pulled without its shards, only new inputs are decoded, only the new
    shards are uploaded, and the result is the same set as a fresh compile of the grown source. The local
    staging gets no plain-Zarr view (nothing reads it there): only the bucket's is written."""
    from dsc.formats import view
    from dsc.store import object as object_store

    src = tmp_path / "src"
    make_folder(src, 100)
    url = "s3://dsc-test/updated"
    opts = dict(OPTS, workers=1, cache_dir=str(tmp_path / "stage"))
    assert dsc.compile_imagefolder(src, url, update=True, **opts).manifest.version["number"] == 0  # a first compile
    make_folder(src, 20, seed0=9000)
    (src / "c1" / "img_00001.jpg").unlink()
    puts, views = [], []
    real_put, real_refresh = object_store.ObjectStore.put, view.refresh
    monkeypatch.setattr(object_store.ObjectStore, "put", lambda self, rel, *a, **k: (puts.append(rel),
                                                                               real_put(self, rel, *a, **k))[1])
    monkeypatch.setattr(view, "refresh", lambda where, *a, **k: (views.append(str(getattr(where, "url", where))),
                                                                 real_refresh(where, *a, **k))[1])
    r = dsc.compile_imagefolder(src, url, update=True, **opts)
    assert r.committed and r.version == 1 and r.plan["decoded"] == 20 and r.plan["removed"] == 1
    assert views == [url]
    assert sorted(p for p in puts if p.startswith("image/c/")) == ["image/c/7/0/0/0", "image/c/8/0/0/0"]
    assert V.record_path(1) in puts and V.record_path(0) not in puts
    local = tmp_path / "fresh.dsc"
    dsc.compile_imagefolder(src, local, **{k: v for k, v in opts.items() if k != "cache_dir"})
    assert set(samples(dsc.open(url, cache_dir=tmp_path / "c")).items()) == set(samples(dsc.open(local)).items())
    assert len(dsc.open(url, version=0, cache_dir=tmp_path / "c")) == 100  # time travel to the base
    again = dsc.compile_imagefolder(src, url, update=True, **opts)
    assert not again.committed and [e["version"] for e in dsc.log(url)] == [0, 1]


def test_compile_to_url_on_a_dask_cluster(s3, src, tmp_path):
    distributed = pytest.importorskip("distributed")
    url = "s3://dsc-test/dask"
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                                  dashboard_address=None) as cluster, distributed.Client(cluster) as client:
        dsc.compile_imagefolder(src, url, executor=client, cache_dir=str(tmp_path), **OPTS)
    local = tmp_path / "local.dsc"
    dsc.compile_imagefolder(src, local, workers=1, **OPTS)
    assert samples(dsc.open(url, cache_dir=tmp_path / "c")) == samples(dsc.open(local))


# --------------------------------------------------------------------------- versions
def test_versions_in_object_storage(s3, src, tmp_path):
    local = tmp_path / "v.dsc"
    dsc.compile_imagefolder(src, local, workers=1, **OPTS)
    make_folder(src.parent / "src2", 40, seed0=5000)  # a second source: version 1 adds it
    import shutil

    grown = tmp_path / "grown"
    shutil.copytree(src, grown)
    shutil.copytree(src.parent / "src2", grown, dirs_exist_ok=True)
    dsc.compile_imagefolder(grown, local, update=True, workers=1, **OPTS)
    url = "s3://dsc-test/versions"
    from dsc.compiler.upload import push

    r = push(local, url, progress=False)
    assert r["versions"] == 2
    assert samples(dsc.open(url, version=0, cache_dir=tmp_path / "c")) == samples(dsc.open(local, version=0))
    latest = dsc.open(url, cache_dir=tmp_path / "c")
    assert latest.version == 1 and len(latest) == 340
    assert [e["version"] for e in dsc.log(url)] == [0, 1]
    dsc.tag(url, "first", version=0)
    assert dsc.open(url, tag="first", cache_dir=tmp_path / "c").version == 0
    again = push(local, url, progress=False)  # a push resumed: everything is there already
    assert again["sent"] == 0
    # the commit is a conditional put: another dataset's record 0 is never replaced
    other = tmp_path / "other.dsc"
    dsc.compile_imagefolder(src.parent / "src2", other, workers=1, **OPTS)
    with pytest.raises(VersionConflictError, match="another dataset's version 0"):
        push(other, url, progress=False)
    assert dsc.open(url, version=0, cache_dir=tmp_path / "c2").manifest.checksum() == \
        dsc.open(local, version=0).manifest.checksum()


def _two_versions_at(url, src, tmp_path):
    """A local dataset of two versions (version 1 adds 20 images), pushed to ``url``; returns its path."""
    import shutil

    from dsc.compiler.upload import push

    local = tmp_path / "v.dsc"
    dsc.compile_imagefolder(src, local, workers=1, **OPTS)
    grown = tmp_path / "grown"
    shutil.copytree(src, grown)
    make_folder(grown, 20, seed0=6000)
    dsc.compile_imagefolder(grown, local, update=True, workers=1, **OPTS)
    push(local, url, progress=False)
    return local


def test_restore_in_object_storage(s3, src, tmp_path, monkeypatch):
    """dsc restore URL: a new version that lists an earlier one's files; only its record (the conditional
    put) and the view are written; a writer that commits first makes it fail with nothing committed."""
    from click.testing import CliRunner

    from dsc.cli import main
    from dsc.store import object as object_store

    url = "s3://dsc-test/restored"
    local = _two_versions_at(url, src, tmp_path)
    dsc.tag(url, "first", version=0)
    puts = []
    real_put = object_store.ObjectStore.put
    monkeypatch.setattr(object_store.ObjectStore, "put", lambda self, rel, *a, **k: (puts.append(rel),
                                                                               real_put(self, rel, *a, **k))[1])
    os.environ["DSC_CACHE_DIR"] = str(tmp_path / "cache")
    try:
        r = CliRunner().invoke(main, ["restore", url, "--tag", "first"])
    finally:
        del os.environ["DSC_CACHE_DIR"]
    assert r.exit_code == 0 and f"version 2 of {url} restores tag first" in r.output, r.output
    assert not [p for p in puts if p.startswith(("image/c/", V.OBJECTS))]  # no shard, no object copied
    assert V.record_path(2) in puts and "zarr.json" in puts  # the commit, then the view
    assert not (tmp_path / "cache" / "uploads").exists() or not any((tmp_path / "cache" / "uploads").iterdir())
    ds = dsc.open(url, cache_dir=tmp_path / "c")
    assert ds.version == 2 and samples(ds) == samples(dsc.open(local, version=0))
    assert dsc.log(url)[-1]["operation"] == "restore 0" and dsc.verify(url).ok
    assert samples(dsc.open(url, version=1, cache_dir=tmp_path / "c")) == samples(dsc.open(local, version=1))

    commit, raced = V.commit, []

    def another_writer_commits_first(store, record):
        if not raced:
            raced.append(store.put(V.record_path(3), store.get(V.record_path(1)), create_only=True))
        return commit(store, record)
    monkeypatch.setattr(V, "commit", another_writer_commits_first)
    with pytest.raises(VersionConflictError, match="another writer committed version 3 first; nothing of this run "
                                                   "was published"):
        dsc.restore(url, version=1)
    monkeypatch.setattr(V, "commit", commit)


def test_restores_racing_on_one_machine_and_a_damaged_latest_version(s3, src, tmp_path, monkeypatch):
    """Two restores of one URL at once: the one that commits second is told (nothing of it committed) and
    leaves the winner's view alone; the files of a damaged latest version are not needed to restore an earlier
    one."""
    from dsc.store import object as object_store

    url = "s3://dsc-test/restore-race"
    local = _two_versions_at(url, src, tmp_path)
    store = open_store(url)
    view_rows = lambda: json.loads(store.get("label/zarr.json"))["shape"][0]  # noqa: E731 - what plain Zarr sees
    rows0, rows1 = (dsc.open(local, version=n).manifest.num_rows for n in (0, 1))
    assert rows0 != rows1 and view_rows() == rows1
    real_commit, real_put, events = V.commit, object_store.ObjectStore.put, []

    def a_then_b(store, record):  # restore A is about to commit; restore B runs whole meanwhile
        if not events:
            events.append("B")
            events[0] = ("B", dsc.restore(url, version=1, cache_dir=tmp_path / "cache"))
        return real_commit(store, record)
    monkeypatch.setattr(V, "commit", a_then_b)
    with pytest.raises(VersionConflictError, match="nothing of this run was published"):
        dsc.restore(url, version=0, cache_dir=tmp_path / "cache")
    assert events == [("B", 2)] and dsc.log(url)[-1]["operation"] == "restore 1" and view_rows() == rows1
    assert not (tmp_path / "cache" / "uploads").exists() or not any((tmp_path / "cache" / "uploads").iterdir())
    monkeypatch.setattr(V, "commit", real_commit)

    def c_commits_then_d(self, rel, *a, **k):  # C committed version 3; D commits 4 and its view before C's
        real_put(self, rel, *a, **k)
        if rel == V.record_path(3) and len(events) == 1:
            events.append("D")
            events[1] = ("D", dsc.restore(url, version=1, cache_dir=tmp_path / "cache"))
    monkeypatch.setattr(object_store.ObjectStore, "put", c_commits_then_d)
    assert dsc.restore(url, version=0, cache_dir=tmp_path / "cache") == 3 and events[-1] == ("D", 4)
    assert view_rows() == rows1  # version 4's (restores 1), not C's version 3 (restores 0)
    monkeypatch.setattr(object_store.ObjectStore, "put", real_put)

    m4, m0 = dsc.open(url, cache_dir=tmp_path / "c").manifest, dsc.open(local, version=0).manifest
    only_latest = {f["sha256"] for f in m4.files.values()} - {f["sha256"] for f in m0.files.values()}
    store.delete(V.object_path(sorted(only_latest)[0]))  # version 4 is damaged now
    assert dsc.restore(url, version=0) == 5
    assert samples(dsc.open(url, cache_dir=tmp_path / "c5")) == samples(dsc.open(local, version=0))
    assert view_rows() == rows0


# --------------------------------------------------------------------------- the CLI
def test_cli_compile_info_verify_log_and_cache(s3, src, tmp_path):
    from click.testing import CliRunner

    from dsc.cli import main

    run = lambda *a: CliRunner().invoke(main, list(map(str, a)))  # noqa: E731
    url = "s3://dsc-test/cli"
    cache = tmp_path / "cache"
    r = run("compile", "imagefolder", src, url, "--size", 16, "--shard-size", 16, "--workers", 1, "-q",
            "--cache-dir", tmp_path / "stage")
    assert r.exit_code == 0, r.output
    assert url in r.output
    r = run("info", url)
    assert r.exit_code == 0 and "300 in 19 shards" in r.output and "in object storage" in r.output, r.output
    os.environ["DSC_CACHE_DIR"] = str(cache)
    try:
        r = run("verify", url)
        assert r.exit_code == 0 and "OK: 19 shard files" in r.output, r.output
        r = run("log", url)
        assert r.exit_code == 0 and "version 0" in r.output, r.output
        r = run("cache", "warm", url, "--cache-limit", "100kB")
        assert r.exit_code == 0 and "shards downloaded" in r.output, r.output
        r = run("cache", "ls")
        assert r.exit_code == 0 and url in r.output and "/19 shards cached" in r.output, r.output
        assert ShardCache(cache).usage() <= 100_000
        r = run("cache", "verify")
        assert r.exit_code == 0 and "OK: " in r.output, r.output
        victim = next(p for p in (cache / "shards").rglob("*") if p.is_file())
        victim.write_bytes(bytes(len(victim.read_bytes())))  # rotted on this disk after its download
        r = run("cache", "verify")
        assert r.exit_code == 1 and "1 of" in r.output and not victim.exists(), r.output
        r = run("cache", "clear", url)
        assert r.exit_code == 0 and "removed" in r.output, r.output
        assert ShardCache(cache).usage() == 0
        r = run("cache", "ls", "--cache-dir", tmp_path / "typo")
        assert r.exit_code == 0 and "empty (no cache there yet" in r.output and not (tmp_path / "typo").exists()
        r = run("info", "S3://dsc-test/cli/")  # scheme in capitals, a trailing slash: the same dataset
        assert r.exit_code == 0 and "dataset   s3://dsc-test/cli\n" in r.output, r.output
        r = run("vacuum", url, "--dry-run")  # object storage has vacuum too (tests/test_stores.py)
        assert r.exit_code == 0 and "Traceback" not in r.output, r.output
        r = run("info", "s3://dsc-test/nothing-here")
        assert r.exit_code == 1 and "no dsc dataset there" in r.output, r.output
    finally:
        os.environ.pop("DSC_CACHE_DIR", None)


# --------------------------------------------------------------------------- units
def test_parse_size_and_urls():
    assert parse_size("200GB") == 200 * 10 ** 9 and parse_size("512MiB") == 512 * 2 ** 20 and parse_size(1000) == 1000
    assert parse_size(None) is None
    for bad in ("lots", "-1GB", 0, "12 parsecs"):
        with pytest.raises(ConfigError):
            parse_size(bad)
    assert is_url("s3://b/p") and is_url("gs://b/p") and is_url("az://acct/c/p")
    assert not is_url("file:///x") and not is_url("/data/x") and not is_url(Path("s3:/b"))
    with pytest.raises(ConfigError, match="s3://, gs:// and az://"):
        open_store("ftp://host/x")


def test_gcs_and_azure_urls_open_through_the_same_store(monkeypatch, tmp_path):
    """No GCS or Azure server here: the stores are built from the standard variables without a request."""
    key = tmp_path / "sa.json"
    monkeypatch.setenv("GOOGLE_SERVICE_ACCOUNT", str(key))
    monkeypatch.setenv("AZURE_STORAGE_ACCOUNT_NAME", "acct")
    monkeypatch.setenv("AZURE_STORAGE_ACCOUNT_KEY", "a2V5")
    assert open_store("az://container/prefix").scheme == "az"
    try:
        store = open_store("gs://bucket/prefix")
        assert store.scheme == "gs"
    except ConfigError as e:  # the key file does not exist: obstore says so, dsc names the URL
        assert "gs://bucket/prefix" in str(e)


def test_aws_config_files_give_credentials_region_and_endpoint(tmp_path):
    (tmp_path / "credentials").write_text("[default]\naws_access_key_id = A\naws_secret_access_key = B\n"
                                          "[train]\naws_access_key_id = C\naws_secret_access_key = D\n")
    (tmp_path / "config").write_text("[profile train]\nregion = eu-west-1\nendpoint_url = http://minio:9000\n")
    env = {"AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "credentials"), "AWS_CONFIG_FILE": str(tmp_path / "config"),
           "HOME": str(tmp_path)}
    assert aws_files_config(env) == {"access_key_id": "A", "secret_access_key": "B"}
    assert aws_files_config({**env, "AWS_PROFILE": "train"}) == {
        "access_key_id": "C", "secret_access_key": "D", "region": "eu-west-1", "endpoint": "http://minio:9000"}
    assert aws_files_config({**env, "AWS_ACCESS_KEY_ID": "env"}) == {}  # the environment wins


def test_clearing_one_dataset_keeps_the_shards_another_shares(published, tmp_path):
    from dsc.compiler.upload import push
    from dsc.runtime.remote import cache_clear, cache_list, warm

    url, local = published
    twin = "s3://dsc-test/twin"
    push(local, twin, progress=False)  # the same content at another URL: the same cached files
    for u in (url, twin):
        warm(u, tmp_path / "c", progress=False)
    assert cache_clear(tmp_path / "c", twin) == (0, 0, 0)
    assert [d["cached"] for d in cache_list(tmp_path / "c")["datasets"]] == [19]
    removed, _, _ = cache_clear(tmp_path / "c", url)
    assert removed == 19 and ShardCache(tmp_path / "c").usage() == 0


def test_two_writers_at_one_url_never_change_each_others_bytes(s3, src, tmp_path):
    """Shards are created with a conditional put: of two datasets published at one URL at once, one commits
    and stays intact, the other gets VersionConflictError."""
    from dsc.compiler.upload import push

    make_folder(tmp_path / "other", 300, seed0=7000)
    a, b = tmp_path / "a.dsc", tmp_path / "b.dsc"
    dsc.compile_imagefolder(src, a, workers=1, **OPTS)
    dsc.compile_imagefolder(tmp_path / "other", b, workers=1, **OPTS)
    for trial in range(3):
        url = f"s3://dsc-test/race{trial}"
        results = {}

        def publish(name, local):
            try:
                push(local, url, progress=False)
                results[name] = "committed"
            except VersionConflictError as e:
                results[name] = e

        threads = [threading.Thread(target=publish, args=(n, p)) for n, p in (("a", a), ("b", b))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        winners = [n for n, r in results.items() if r == "committed"]
        assert len(winners) <= 1, results
        if winners:
            want = samples(dsc.open(a if winners == ["a"] else b))
            assert samples(dsc.open(url, cache_dir=tmp_path / f"c{trial}")) == want
        else:  # both found the other's files: nothing committed; vacuum removes the leftovers, then one publishes
            assert dsc.vacuum(url, older_than=0).leftovers > 0
            push(a, url, progress=False)
            assert samples(dsc.open(url, cache_dir=tmp_path / f"c{trial}")) == samples(dsc.open(a))


def test_an_object_larger_than_the_manifest_says_is_cut_off(own_server, tmp_path):
    server, url = own_server
    store = open_store(url)
    store.put("image/c/2/0/0/0", b"x" * 3_000_000)
    ds = dsc.open(url, cache_dir=tmp_path / "c", cache_limit="100kB", retry_seconds=5)  # (in-flight downloads outlive the server)
    with UsageWatch(tmp_path / "c") as watch:
        with pytest.raises(CorruptDatasetError, match=r"image/c/2/0/0/0 has more than the 12,548 bytes it may have"):
            epoch(dsc.Loader(ds, batch_size=16))
    assert watch.peak <= 100_000


class FolderStore:
    """A registered store over a local folder: the Store interface is all dsc needs from a backend."""

    def __init__(self, url, retry):
        from dsc.store import Store

        self.__class__ = type("FolderStore", (FolderStore, Store), {})
        self.url = url.rstrip("/")
        self.base = Path(url.split("://", 1)[1])

    def download(self, rel, f, on_chunk=None, limit=None):
        try:
            data = (self.base / rel).read_bytes()
        except FileNotFoundError:
            raise FileNotFoundError(self.where(rel)) from None
        if limit is not None and len(data) > limit:
            raise CorruptDatasetError(f"{self.where(rel)} is too large")
        f.seek(0)
        if on_chunk:
            on_chunk(None)
            on_chunk(memoryview(data))
        f.write(data)
        f.truncate()
        return len(data)

    def put(self, rel, data, create_only=False, attributes=None):
        p = self.base / rel
        if create_only and p.exists():
            raise FileExistsError(self.where(rel))
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data.read() if hasattr(data, "read") else bytes(data))
        (p.parent / f".{p.name}.meta").write_text(json.dumps(attributes or {}))

    def stat(self, rel):
        p = self.base / rel
        if not p.is_file():
            return None
        meta = p.parent / f".{p.name}.meta"
        return p.stat().st_size, json.loads(meta.read_text()) if meta.exists() else {}

    def list(self, prefix):
        return sorted((str(p.relative_to(self.base)), p.stat().st_size) for p in self.base.rglob("*")
                      if p.is_file() and not p.name.startswith(".") and str(p.relative_to(self.base)).startswith(prefix))

    def delete(self, rel):
        (self.base / rel).unlink(missing_ok=True)


def test_a_registered_store_serves_compile_open_and_cache(src, tmp_path):
    from dsc.store import register_store
    from dsc.runtime.remote import cache_list

    register_store("folder", FolderStore)
    url = f"folder://{tmp_path / 'bucket'}/ds"
    dsc.compile_imagefolder(src, url, workers=1, cache_dir=str(tmp_path / "stage"), **OPTS)
    local = tmp_path / "local.dsc"
    dsc.compile_imagefolder(src, local, workers=1, **OPTS)
    ds = dsc.open(url, cache_dir=tmp_path / "c", cache_limit=int(dataset_bytes(local) * 0.3))
    assert epoch(dsc.Loader(ds, batch_size=16, order="quasi_random", window=2)).keys() == set(range(300))
    assert samples(ds) == samples(dsc.open(local))
    assert [d["url"] for d in cache_list(tmp_path / "c")["datasets"]] == [url]


class RangedFolderStore(FolderStore):
    """FolderStore with the optional identity and read_range: what a plugin over a bucket would add."""

    def __init__(self, url, retry):
        from dsc.store import Store

        self.__class__ = type("RangedFolderStore", (RangedFolderStore, Store), {})
        self.url = url.rstrip("/")
        self.base = Path(url.split("://", 1)[1])

    def identity(self, rel):
        p = self.base / rel
        return (p.stat().st_size, p.stat().st_mtime, str(p.stat().st_mtime_ns)) if p.is_file() else None

    def read_range(self, rel, start, end):
        with open(self.base / rel, "rb") as f:
            f.seek(start)
            return f.read(max(0, end - start))

    def list_detailed(self, prefix):
        return [(rel, size, 0.0) for rel, size in self.list(prefix)]


@pytest.mark.parametrize("scheme, cls", [("folder", FolderStore), ("rfolder", RangedFolderStore)])
def test_a_registered_store_serves_a_parquet_url(tmp_path, monkeypatch, scheme, cls):
    """A Parquet URL on a registered store: its footer's first read (``read_tail``) is the Store's own (identity,
    else stat, for the size; then the range), not only object storage's; a missing one names the URL."""
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    from dsc.errors import SourceError
    from dsc.store import register_store
    from test_cluster_remote import samples_png

    register_store(scheme, cls)
    monkeypatch.chdir(tmp_path)  # (the bucket b: the folder b here)
    (tmp_path / "b").mkdir()
    pq.write_table(pa.table({"image": [samples_png(k) for k in range(6)], "label": [k % 2 for k in range(6)]}),
                   tmp_path / "b" / "t.parquet")
    r = dsc.compile_table(f"{scheme}://b/t.parquet", tmp_path / "out", workers=1, **OPTS)
    ref = dsc.compile_table(tmp_path / "b" / "t.parquet", tmp_path / "ref", workers=1, **OPTS)
    assert samples(dsc.open(r.path)) == samples(dsc.open(ref.path))
    if scheme == "folder":  # (this one lists no objects: the protocol's list_detailed left out)
        return
    with pytest.raises(SourceError, match=r"b/none\.parquet: no such object \(and no objects under it as a prefix\)"):
        dsc.compile_table(f"{scheme}://b/none.parquet", tmp_path / "out2", workers=1, **OPTS)


@pytest.mark.parametrize("order", ["random", "quasi_random", "sequential"])
def test_ranged_reads_serve_the_bytes_of_every_other_strategy(published, tmp_path, order):
    """No shard cache (cache_limit=0): each sample by a byte range, the same batches as a local dataset's
    (order, resume, rank parts), nothing downloaded whole, neighbours in a shard one GET."""
    url, local = published
    kw = dict(batch_size=20, order=order, seed=4, window=2 if order == "quasi_random" else None)
    ds = dsc.open(url, cache_dir=tmp_path / "c", cache_limit=0)
    for rank in (None, 1):
        part = dict(rank=rank, world_size=2) if rank is not None else {}
        ranged = dsc.Loader(ds, **kw, **part)
        assert ranged.read_strategy == "ranged" and "cache_limit=0" in ranged.read_reason
        for read in ("mapped", "direct"):
            other = dsc.Loader(dsc.open(local), read=read, **kw, **part)
            ranged.set_epoch(0)
            for a, b in zip(ranged, other, strict=True):
                assert torch_equal(a, b)
        it = iter(ranged)
        next(it)
        state = ranged.state_dict()
        rest = [b["index"].tolist() for b in it]
        resumed = dsc.Loader(ds, **kw, **part)
        resumed.load_state_dict(state)
        assert [b["index"].tolist() for b in resumed] == rest
    reads = ranged._reads
    assert ds.storage.cache.downloads == 0 and not list((tmp_path / "c" / "shards").rglob("*"))
    assert 0 < reads.requests == reads.reads
    before, fetched = reads.requests, reads.bytes_fetched
    pairs = sum(len(np.unique(b["index"].numpy() // 16)) for b in ranged)  # (batch, shard) pairs of an epoch
    assert reads.requests - before == pairs  # a shard's samples of a batch (close neighbours here): one GET
    assert reads.bytes_fetched - fetched < len(ranged) * 20 * 16 * 16 * 3 * 2.5


def torch_equal(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(a[k].numpy().tobytes() == b[k].numpy().tobytes() for k in a)


def test_a_store_reads_a_byte_range(published, tmp_path):
    url, local = published
    spec = dsc.open(local).manifest.shards[3]
    whole = (local / spec.path).read_bytes()
    for store in (open_store(url), open_store(str(local))):
        assert bytes(store.get_range(spec.path, 100, 900)) == whole[100:900]
        with pytest.raises(CorruptDatasetError, match="ends before byte"):
            store.get_range(spec.path, 100, len(whole) + 5)


def test_a_versions_record_is_fetched_once_per_node(published, tmp_path, monkeypatch):
    """The ranks of a node (and every later open) share the mirror's copy of the version record: after the
    first open, an open asks only for its ETag (no content); a record written again is fetched again."""
    from dsc.store.object import ObjectStore

    url, local = published
    gets = []
    real = ObjectStore.get

    def counting(self, rel, limit=None):
        gets.append(rel)
        return real(self, rel, limit)

    monkeypatch.setattr(ObjectStore, "get", counting)
    first = dsc.open(url, cache_dir=tmp_path / "c")
    record = V.record_path(first.version)
    assert gets.count(record) == 1
    want = samples(first)  # (the first read fetches the shard table, once for the node: see test_shard_table.py)
    gets.clear()
    for _ in range(3):  # (three more ranks of the node)
        assert samples(dsc.open(url, cache_dir=tmp_path / "c")) == want
    assert record not in gets and not [g for g in gets if g.startswith("_dsc/objects/")]
    mirror = next((tmp_path / "c" / "datasets").iterdir())
    (mirror / record).write_bytes(b"{}")  # a damaged local copy is not used...
    (mirror / (record + ".etag")).write_bytes(b"another")  # ...nor one of another write of the object
    assert samples(dsc.open(url, cache_dir=tmp_path / "c")) == samples(first) and gets.count(record) == 1


def test_a_remote_handle_keeps_its_labels_when_the_cache_is_cleared(published, tmp_path):
    """A remote version's small arrays come at open, the labels too (read lazily elsewhere): `dsc cache clear`
    while a handle is open removes the mirror they were read from, and the handle still answers."""
    from dsc.runtime.remote import cache_clear

    url, local = published
    ds = dsc.open(url, cache_dir=tmp_path / "c")
    cache_clear(tmp_path / "c")
    assert ds.labels.tolist() == dsc.open(local).labels.tolist()
    assert ds[5]["label"] == int(dsc.open(local).labels[5])


def test_staging_removals_set_aside_by_threads_at_once_all_go(tmp_path, monkeypatch):
    """Compiles to URLs ending in several threads of a process at once: each staging folder set aside is
    removed, none raises (the removals' table is shared by the threads: under a lock)."""
    import sys
    import threading

    from dsc.compiler import upload

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # (frequent thread switches: the race without the lock shows in every run)
    errors = []

    def one(k):
        root = tmp_path / f"u{k % 8}"
        stage = root / f"run-{k}"
        stage.mkdir(parents=True, exist_ok=True)
        (stage / "f").write_bytes(b"x")
        try:
            upload._unstage(root, stage, background=True)
        except Exception as e:  # noqa: BLE001 (any error is the failure)
            errors.append(repr(e))
    try:
        for rnd in range(10):
            threads = [threading.Thread(target=one, args=(rnd * 20 + i,)) for i in range(20)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
    finally:
        sys.setswitchinterval(old)
    upload.unstaged()
    assert errors == []
    assert [p for p in tmp_path.rglob("*") if upload.GONE in p.name] == []
