"""Read strategies (runtime/reads.py, runtime/schedule.py): which one runs, the same batches under each,
bounded memory, and the disk reading what is served."""
import os
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch

import dsc
from dsc.bench import disk_read_bytes, drop_page_cache
from dsc.errors import ConfigError, DscError
from dsc import env as E
from dsc.runtime import reads as R
from dsc.runtime.schedule import ShardSchedule, live_bytes

STRATEGIES = ("mapped", "windowed", "direct")
ORDERS = ("sequential", "random", "quasi_random")


class Arrays(torch.utils.data.Dataset):
    """Distinct uint8 samples without a decode: fixed (h, w) or each its own size."""

    def __init__(self, n, size=None, seed=0, masks=False):
        self.n, self.size, self.seed, self.masks = n, size, seed, masks

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        rng = np.random.default_rng([self.seed, i])
        h, w = self.size or (int(rng.integers(5, 30)), int(rng.integers(5, 30)))
        img = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
        if self.masks:
            return img, rng.integers(0, 4, (h, w)).astype(np.uint8)
        return img, i % 7


@pytest.fixture(scope="module")
def datasets(tmp_path_factory):
    root = tmp_path_factory.mktemp("reads")
    dsc.compile(Arrays(230, (16, 12)), root / "fixed", size=(16, 12), shard_size=9, progress=False, workers=1)
    dsc.compile(Arrays(230), root / "ragged", shard_size=9, progress=False, workers=1)
    dsc.compile(Arrays(120, masks=True), root / "masks", shard_size=7, progress=False, workers=1)
    return {k: dsc.open(root / k) for k in ("fixed", "ragged", "masks")}


def batches_of(loader, epochs=(0, 1)):
    out = []
    for e in epochs:
        loader.set_epoch(e)
        out += [{k: v.clone() for k, v in b.items()} for b in loader]
    return out


def assert_same(a, b, what):
    assert len(a) == len(b), what
    for x, y in zip(a, b):
        assert x.keys() == y.keys(), what
        for k in x:
            assert torch.equal(x[k], y[k]), (what, k)


# ----------------------------------------------------------------------------- the choice
def test_a_dataset_that_fits_is_mapped_one_that_does_not_is_read_by_order(datasets, monkeypatch):
    ds = datasets["fixed"]
    size = ds.shard_bytes
    assert size == sum(s.nbytes for s in ds.manifest.shards)
    monkeypatch.setenv("DSC_MEMORY", str(size * 10))
    for order in ORDERS:
        ld = dsc.Loader(ds, batch_size=8, order=order)
        assert ld.read_strategy == "mapped" and "fits" in ld.read_reason and "$DSC_MEMORY" in ld.read_reason
    monkeypatch.setenv("DSC_MEMORY", str(size // 2))
    got = {o: dsc.Loader(ds, batch_size=8, order=o) for o in ORDERS}
    assert {o: ld.read_strategy for o, ld in got.items()} == {"sequential": "windowed", "quasi_random": "windowed",
                                                                "random": "direct"}
    assert "read='direct'" in repr(got["random"]) and "one read per sample" in repr(got["random"])
    assert dsc.Loader(ds, batch_size=8, order="random", read="windowed").read_strategy == "windowed"  # forced
    assert dsc.Loader(ds, batch_size=8, order="random", cache="ram").read_strategy == "mapped"
    with pytest.raises(ConfigError, match="read must be one of"):
        dsc.Loader(ds, batch_size=8, read="fast")
    with pytest.raises(ConfigError, match="cache='ram'"):
        dsc.Loader(ds, batch_size=8, read="direct", cache="ram")
    with pytest.raises(ConfigError, match=r"\$DSC_MEMORY"):
        monkeypatch.setenv("DSC_MEMORY", "lots")
        dsc.Loader(ds, batch_size=8)


def test_the_memory_figure_is_the_machines_or_the_cgroups(monkeypatch):
    monkeypatch.delenv("DSC_MEMORY", raising=False)
    def mem_available():
        meminfo = {ln.split()[0]: int(ln.split()[1]) for ln in Path("/proc/meminfo").read_text().splitlines()}
        return meminfo["MemAvailable:"] * 1024

    before = mem_available()
    avail, where = R.available_memory()
    after = mem_available()
    assert avail > 0 and ("MemAvailable" in where or "cgroup" in where)
    # (other processes move MemAvailable between the reads: the figure is at most the larger of the two)
    assert avail <= max(before, after)
    monkeypatch.setenv("DSC_MEMORY", "3GiB")
    assert R.available_memory() == (3 << 30, "$DSC_MEMORY")


def test_the_cgroup_is_found_where_its_file_system_is_mounted():
    """In a container the memory controller's mount shows the container's own cgroup at its top (the mount's
    root is /docker/<id>); /proc/self/cgroup still names /docker/<id>."""
    v1 = ("31 25 0:28 /docker/abc /sys/fs/cgroup/memory rw,nosuid - cgroup cgroup rw,memory\n"
          "35 25 0:30 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n")
    mounts = E._mounts(v1)
    assert mounts == {"v1": ("/docker/abc", Path("/sys/fs/cgroup/memory")), "v2": ("/", Path("/sys/fs/cgroup/unified"))}
    assert E._cgroup_dir("v1", "/docker/abc", mounts) == Path("/sys/fs/cgroup/memory")
    assert E._cgroup_dir("v1", "/docker/abc/sub", mounts) == Path("/sys/fs/cgroup/memory/sub")
    assert E._cgroup_dir("v2", "/user.slice/x", mounts) == Path("/sys/fs/cgroup/unified/user.slice/x")
    assert E._cgroup_dir("v1", "/elsewhere", mounts) == Path("/sys/fs/cgroup/memory")  # outside the mount: its top
    assert E._mounts("garbage\n\n1 2 3 - \n") == {}


def test_the_cgroup_figures_are_its_limit_and_what_it_holds_besides_page_cache(tmp_path):
    """v1: the hierarchical limit, and usage (hierarchical) minus total_cache (hierarchical), not the group's
    own "cache" line that memory.stat lists first; v2: the lowest memory.max up the tree, current minus file."""
    v1 = tmp_path / "v1" / "job"
    v1.mkdir(parents=True)
    (v1 / "memory.stat").write_text("cache 100\nrss 5\nhierarchical_memory_limit 4000\ntotal_cache 700\n")
    (v1 / "memory.limit_in_bytes").write_text("9000\n")
    (v1 / "memory.usage_in_bytes").write_text("1000\n")
    assert E.cgroup_limit("4:memory:/job\n", {"v1": ("/", tmp_path / "v1")}) == (
        4000, 300, "cgroup memory.limit_in_bytes")
    v2 = tmp_path / "v2" / "a" / "b"
    v2.mkdir(parents=True)
    (tmp_path / "v2" / "a" / "memory.max").write_text("5000\n")
    (v2 / "memory.max").write_text("max\n")
    (v2 / "memory.current").write_text("2000\n")
    (v2 / "memory.stat").write_text("anon 10\nfile 1500\n")
    assert E.cgroup_limit("0::/a/b\n", {"v2": ("/", tmp_path / "v2")}) == (5000, 500, "cgroup memory.max")


def test_dsc_info_says_how_each_order_is_read(datasets, monkeypatch):
    from click.testing import CliRunner

    from dsc.cli import main

    path = str(datasets["fixed"].path)
    r = CliRunner().invoke(main, ["info", path])
    assert r.exit_code == 0 and "mapped in every order" in r.output, r.output
    monkeypatch.setenv("DSC_MEMORY", "1000")
    r = CliRunner().invoke(main, ["info", path])
    assert "direct (order random), windowed (sequential, quasi_random)" in r.output, r.output


# ----------------------------------------------------------------------------- the same batches
@pytest.mark.parametrize("kind,forms", [("fixed", {}), ("ragged", {}), ("ragged", {"images": "padded"}),
                                        ("masks", {}), ("masks", {"images": "padded"})])
@pytest.mark.parametrize("order", ORDERS)
def test_every_strategy_serves_the_same_batches(datasets, kind, forms, order):
    ds = datasets[kind]
    runs = {}
    for read in STRATEGIES:
        loader = dsc.Loader(ds, batch_size=13, order=order, seed=4, window=3, read=read, **forms)
        runs[read] = batches_of(loader)
        loader.close()
    for read in STRATEGIES[1:]:
        assert_same(runs["mapped"], runs[read], (kind, forms, order, read))
    served = np.concatenate([b["index"].numpy() for b in runs["direct"][:len(runs["direct"]) // 2]])
    assert sorted(served.tolist()) == list(range(len(ds)))
    ref = ds.get_batch(runs["direct"][3]["index"].numpy(), images=forms.get("images"))
    for k in ref:
        assert torch.equal(ref[k], runs["direct"][3][k]), k


@pytest.mark.parametrize("read", STRATEGIES[1:])
def test_strategies_keep_resume_and_rank_partitions(datasets, read):
    ds = datasets["ragged"]
    for order in ORDERS:
        for rank in range(3):
            kw = dict(batch_size=6, order=order, seed=2, window=2, rank=rank, world_size=3)
            ref = batches_of(dsc.Loader(ds, read="mapped", **kw), epochs=(1,))
            got = batches_of(dsc.Loader(ds, read=read, **kw), epochs=(1,))
            assert_same(ref, got, (read, order, rank))
            a = dsc.Loader(ds, read="mapped", **kw)
            a.set_epoch(1)
            it = iter(a)
            for _ in range(4):
                next(it)
            state = a.state_dict()
            a.close()
            b = dsc.Loader(ds, read=read, **kw)
            b.load_state_dict(state)
            assert_same(ref[4:], [{k: v.clone() for k, v in x.items()} for x in b], (read, order, rank, "resume"))


def test_transforms_in_the_gather_read_the_same_pixels(datasets):
    from dsc import transforms as T

    ds = datasets["ragged"]
    chain = [T.RandomResizedCrop(8, scale=(0.3, 1.0)), T.RandomHorizontalFlip()]
    runs = {read: batches_of(dsc.Loader(ds, batch_size=16, order="random", seed=1, read=read, transforms=chain))
            for read in STRATEGIES}
    assert_same(runs["mapped"], runs["direct"], "direct")
    assert_same(runs["mapped"], runs["windowed"], "windowed")


def test_detection_batches_under_every_strategy(tmp_path):
    from dsc.synthetic import detection_scenes, write_coco

    ann, images = write_coco(tmp_path / "coco", detection_scenes(30, seed=3))
    for opts in (dict(size=32, resize="pad"), dict(max_side=40)):
        out = tmp_path / f"out{len(opts)}"
        dsc.compile_coco(ann, images, out, shard_size=6, progress=False, workers=1, **opts)
        ds = dsc.open(out)
        for boxes in ("packed", "padded"):
            runs = {read: batches_of(dsc.Loader(ds, batch_size=7, order="random", read=read, boxes=boxes))
                    for read in STRATEGIES}
            assert_same(runs["mapped"], runs["direct"], ("direct", opts, boxes))
            assert_same(runs["mapped"], runs["windowed"], ("windowed", opts, boxes))


# ----------------------------------------------------------------------------- bounded memory
def test_windowed_reads_hold_a_bounded_window_of_a_dataset_many_times_bigger(tmp_path):
    dsc.compile(Arrays(600, (16, 16)), tmp_path / "big", size=(16, 16), shard_size=10, progress=False, workers=1)
    ds = dsc.open(tmp_path / "big")
    shard = ds.manifest.shards[0].nbytes
    for order in ("sequential", "quasi_random"):
        loader = dsc.Loader(ds, batch_size=8, order=order, window=2, read="windowed", prefetch=2)
        reads = loader._reads
        peaks, schedules = [], []
        for e in range(3):
            loader.set_epoch(e)
            it = iter(loader)
            schedules.append(it._state.feed)
            for b in it:
                peaks.append(reads.held_bytes)
        assert all(s is not None for s in schedules)
        budget = reads.budget
        assert budget <= 8 * shard, (order, budget, shard)  # a window of 2 shards read ahead: not 60 shards
        assert max(peaks) <= budget and reads.peak_bytes <= budget and max(s.peak_bytes for s in schedules) <= budget
        assert ds.shard_bytes > 6 * budget
        assert reads.held_bytes == 0 and not ds.storage._maps  # released behind; the dataset's own maps unused
        loader.close()
    direct = dsc.Loader(ds, batch_size=8, order="random", read="direct")
    batches_of(direct)
    assert direct._reads.held_bytes == 0 and not ds.storage._maps and direct._reads.reads > 0
    mapped = dsc.Loader(ds, batch_size=8, order="random", read="mapped")
    batches_of(mapped, epochs=(0,))
    assert len(ds.storage._maps) == len(ds.manifest.shards)  # what the mapped strategy does instead


@pytest.mark.parametrize("read", STRATEGIES)
def test_a_loop_that_drops_its_batches_reuses_the_same_buffers(datasets, read):
    """No strategy keeps a reference to a ring slot after its batch is made (an I/O thread holding a view of
    the slot would make the ring allocate a new buffer per batch: memory growing epoch after epoch)."""
    for kind in ("fixed", "ragged"):
        loader = dsc.Loader(datasets[kind], batch_size=16, order="random", read=read, io_depth=4)
        for e in range(4):
            loader.set_epoch(e)
            for b in loader:
                del b
        assert loader._ring.taken == 0, (read, kind)
        kept = list(loader)  # batches kept: their buffers are left to the user, the ring makes new ones
        assert loader._ring.taken > 0 and len(kept) == len(loader)
        loader.close()


def test_the_disk_reads_what_is_served_on_a_cold_cache(tmp_path):
    dsc.compile(Arrays(1200, (64, 64)), tmp_path / "cold", size=(64, 64), shard_size=100, progress=False, workers=1)
    ds = dsc.open(tmp_path / "cold")
    files = [ds.path / s.path for s in ds.manifest.shards]
    drop_page_cache(files)
    b0 = disk_read_bytes()
    (files[0]).read_bytes()
    if b0 is None or disk_read_bytes() - b0 < files[0].stat().st_size // 2:
        pytest.skip("this file system or kernel does not let a test drop a file's pages and count what is read")
    sample = 64 * 64 * 3
    # (a batch prefetched but not served is read and not counted: one thread, one batch ahead, 16 batches served)
    for order, read, batches in (("random", "direct", 16), ("quasi_random", "windowed", None),
                                 ("sequential", "windowed", None)):
        drop_page_cache(files)
        loader = dsc.Loader(dsc.open(tmp_path / "cold"), batch_size=32, order=order, read=read, window=2,
                            num_threads=1, prefetch=1)
        b0, served = disk_read_bytes(), 0
        for j, b in enumerate(loader):
            served += b["image"].numel()
            if batches is not None and j + 1 == batches:
                break
        loader.close()
        ratio = (disk_read_bytes() - b0) / served
        assert served >= 4 * 32 * sample and ratio <= 1.15, (order, read, ratio)
    drop_page_cache(files)  # what the mapped strategy reads for the same few random batches: whole shards
    loader = dsc.Loader(dsc.open(tmp_path / "cold"), batch_size=32, order="random", read="mapped", num_threads=1,
                        prefetch=1)
    b0, served = disk_read_bytes(), 0
    for j, b in zip(range(16), loader):
        served += b["image"].numel()
    loader.close()
    assert (disk_read_bytes() - b0) / served > 2


# ----------------------------------------------------------------------------- the schedule itself
def _needs(batches):
    return [np.asarray(b, np.int64) for b in batches]


def test_schedule_keeps_its_budget_fetches_in_order_and_lets_everything_go():
    rng = np.random.default_rng(0)
    needs = _needs([rng.choice(20, 3, replace=False) for _ in range(40)])
    nbytes = np.full(20, 100)
    log, held = [], set()
    lock = threading.Lock()

    def fetch(k):
        with lock:
            assert k not in held
            held.add(k)
            log.append(k)
            peak.append(len(held))

    def release(k):
        with lock:
            held.remove(k)

    peak = []
    s = ShardSchedule(needs, 0, nbytes, fetch, release, budget=500, workers=3)
    for j in range(len(needs)):
        s.wait(j)
        with lock:
            assert set(needs[j].tolist()) <= held
        s.done(j)
    s.close()
    assert held == set() and max(peak) <= 5 and s.peak_bytes <= 500
    assert len(log) > 20  # shards no batch walked still needed were let go and fetched again later


def test_schedule_holds_what_is_there_without_a_thread_and_reports_failures():
    needs = _needs([[0, 1], [1, 2], [2, 3]])
    nbytes = np.full(4, 10)
    released = []
    s = ShardSchedule(needs, 0, nbytes, lambda k: None, released.append, per_batch=False, fetch_now=lambda k: True)
    assert s.thread is None and s.ready == 3  # a warm cache: nothing to fetch, nothing to wait for
    for j in range(3):
        s.wait(j)
        s.done(j)
    assert released == []  # held until the epoch ends
    s.close()
    assert sorted(released) == [0, 1, 2, 3]

    def fetch(k):
        if k == 2:
            raise DscError("shard 2 is damaged")
        time.sleep(0.01)

    s = ShardSchedule(needs, 0, nbytes, fetch, lambda k: None, budget=100, workers=2)
    s.wait(0)
    with pytest.raises(DscError, match="shard 2 is damaged"):
        s.wait(1)
    s.close()


def test_schedule_budget_is_a_bound_with_fillers_finishing_out_of_order():
    rng = np.random.default_rng(1)
    needs = _needs([rng.choice(30, int(rng.integers(1, 4)), replace=False) for _ in range(300)])
    nbytes = rng.integers(50, 150, 30)
    held, peak = {}, [0]
    lock = threading.Lock()

    def fetch(k):
        time.sleep(0.0005)
        with lock:
            held[k] = int(nbytes[k])
            peak[0] = max(peak[0], sum(held.values()))

    def release(k):
        time.sleep(0.0005)
        with lock:
            del held[k]  # (a release that overlapped the same shard's next fetch would fail here or above)

    budget = 450
    s = ShardSchedule(needs, 0, nbytes, fetch, release, budget=budget, workers=3)
    nxt = iter(range(len(needs)))
    take = threading.Lock()

    failed = []

    def filler():
        try:
            while True:
                with take:
                    j = next(nxt, None)
                if j is None:
                    return
                s.wait(j)
                with lock:
                    assert set(needs[j].tolist()) <= set(held)
                time.sleep(float(rng.random()) * 0.001)
                s.done(j)
        except BaseException as e:  # noqa: BLE001
            failed.append(e)
            s.close()

    threads = [threading.Thread(target=filler) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    s.close()
    assert not failed and not any(t.is_alive() for t in threads), failed
    assert held == {} and peak[0] <= budget and s.peak_bytes <= budget, (peak[0], s.peak_bytes)


def test_direct_reads_into_a_strided_output_and_too_many_open_files(datasets, tmp_path):
    ds = datasets["fixed"]
    reads = R.make("direct", ds.storage, io_depth=2)
    idx = np.arange(10, 30)
    out = np.zeros((40, 16, 12, 3), np.uint8)[::2]  # not contiguous
    ds.readers["image"].px.gather(idx, out, reads)
    assert np.array_equal(out, ds.get_batch(idx)["image"].numpy())
    reads.close()
    import subprocess
    import sys

    script = f"""
import os, resource, dsc
from dsc.errors import TooManyOpenFilesError
ds = dsc.open({str(ds.path)!r})
n = len(os.listdir("/proc/self/fd"))
resource.setrlimit(resource.RLIMIT_NOFILE, (n + 40, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
loader = dsc.Loader(ds, batch_size=64, order="random", read="direct", io_depth=2)
assert loader._reads.max_fds <= 8, loader._reads.max_fds
assert sum(b["image"].shape[0] for b in loader) == len(ds)  # 26 shards through at most 8 open files
hog = []
try:
    while True:
        hog.append(os.open("/dev/null", os.O_RDONLY))
except OSError:
    pass
try:
    ds.storage.dir.open_file(ds.manifest.shards[0].path)
except TooManyOpenFilesError as e:
    print("refused:", e)
"""
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "refused:" in r.stdout and "ulimit -n" in r.stdout


def test_live_bytes_is_the_most_an_order_needs_at_once():
    assert live_bytes(_needs([[0], [0, 1], [1], [2]]), np.array([5, 7, 11])) == 12
    assert live_bytes(_needs([[0], [1], [2]]), np.array([5, 7, 11])) == 11


def test_windowed_schedule_reads_each_shard_once_below_the_orders_need():
    """A quasi_random epoch needs two windows of shards at once at each window's edge; with a read-ahead
    budget below that (a tight memory cgroup), each shard is still fetched once (before: let go when no
    walked batch held it, and read again for the batches the walk had not reached, 2.5x the bytes)."""
    from dsc.runtime.orders.quasi_random import quasi_random_order
    from dsc.runtime.schedule import shard_needs

    K, n, B = 10, 400, 16
    order = quasi_random_order(n, K, 0, 0, window=4)
    needs = shard_needs([np.sort(order[i:i + B]) for i in range(0, n, B)], K)
    nbytes = np.full(n // K, 100)
    assert live_bytes(needs, nbytes) > 600
    for hold_to_last, fetched_once in ((False, False), (True, True)):
        s = ShardSchedule(needs, 0, nbytes, lambda k: None, lambda k: None, budget=600, workers=2,
                          hold_to_last=hold_to_last)
        for j in range(len(needs)):
            s.wait(j)
            s.done(j)
        s.close()
        assert (s.fetches == n // K) == fetched_once, (hold_to_last, s.fetches)


def test_windowed_schedule_reads_the_next_windows_shards_while_this_one_is_served():
    """quasi_random's first batch of a window needs all of the window's shards. Taken together they waited for
    room for the whole window, which came only once every batch of the last window was gathered: the disk sat
    idle while a window was served (issue 34: quasi_random at 89% of the sequential read under a 1 GiB cgroup).
    Taken one at a time, those that fit the budget are read while the last window is served."""
    W, windows, per = 4, 3, 5  # windows of 4 shards, 5 batches each, the first of each also reading the last window
    needs = []
    for w in range(windows):
        this = list(range(w * W, (w + 1) * W))
        needs += [list(range((w - 1) * W, w * W)) + this if w else this] + [this] * (per - 1)
    needs = _needs(needs)
    nbytes = np.full(windows * W, 100)
    fetched = []
    s = ShardSchedule(needs, 0, nbytes, fetched.append, lambda k: None, budget=600, workers=2, hold_to_last=True)
    deadline = time.monotonic() + 10
    while len(fetched) < 6 and time.monotonic() < deadline:  # (the walk runs in its own thread)
        time.sleep(0.01)
    time.sleep(0.05)
    # window 0's 4 shards, then 2 of window 1's while no batch is gathered yet (before: 4, the window waited)
    assert len(fetched) == s.fetches == 6 and s.peak_bytes <= 600, fetched
    assert set(fetched) >= {0, 1, 2, 3} and len(set(fetched) & {4, 5, 6, 7}) == 2  # (workers finish in any order)
    for j in range(len(needs)):
        s.wait(j)
        s.done(j)
    s.close()
    assert sorted(fetched) == list(range(windows * W)) and s.bytes_held == 0  # each shard read once


def test_windowed_budget_follows_the_memory_available_when_the_epoch_starts(tmp_path, monkeypatch):
    """The read-ahead is sized to the memory there is as each epoch starts (the ring, a model, the rest of
    the cgroup hold theirs by then), not to the figure the Loader was made with."""
    dsc.compile(Arrays(64, (8, 8)), tmp_path / "d.dsc", shard_size=4, progress=False)
    ds = dsc.open(tmp_path / "d.dsc")
    monkeypatch.delenv("DSC_MEMORY", raising=False)
    monkeypatch.setattr(R, "available_memory", lambda: (10_000, "test"))
    loader = dsc.Loader(ds, batch_size=8, order="quasi_random", read="windowed", device="cpu", num_threads=1)
    shard = max(s.nbytes for s in ds.manifest.shards)
    sum(1 for _ in loader)
    roomy = loader._reads.budget
    monkeypatch.setattr(R, "available_memory", lambda: (2 * shard, "test: the rest of the group took the rest"))
    sum(1 for _ in loader)
    assert roomy > 2 * shard and loader._reads.budget == shard
    loader.close()


def test_ranged_reads_get_each_samples_bytes_coalescing_only_close_neighbours():
    """``ranged``: one GET per run of samples of a shard within RANGE_GAP of each other, exactly the bytes
    asked for otherwise, each piece at its place in the destination, in any order of the samples."""
    from types import SimpleNamespace

    files = {f"s{k}": np.random.default_rng(k).integers(0, 256, 4 * R.RANGE_GAP, dtype=np.uint8).tobytes()
             for k in range(2)}
    gets = []

    class Store:
        local = False

        def read_range_pinned(self, rel, start, end, etag=None):
            gets.append((rel, start, end))
            return files[rel][start:end], None, {}

    reads = R.make("ranged", SimpleNamespace(store=Store()))
    shards = [SimpleNamespace(path="s0"), SimpleNamespace(path="s1")]
    # shard 1: two neighbours 10 bytes apart (one GET), one far after them; shard 0: one far sample first
    slots = [1, 0, 1, 1]
    offsets = [3 * R.RANGE_GAP, 2 * R.RANGE_GAP, 100, 210]
    sizes = [50, 70, 100, 30]
    dest = np.zeros(400, np.uint8)
    dest_at = [0, 60, 200, 330]
    reads.read(shards, slots, offsets, sizes, dest, dest_at)
    for s, o, n, d in zip(slots, offsets, sizes, dest_at):
        assert dest[d:d + n].tobytes() == files[f"s{s}"][o:o + n]
    assert sorted(gets) == [("s0", 2 * R.RANGE_GAP, 2 * R.RANGE_GAP + 70), ("s1", 100, 240),
                            ("s1", 3 * R.RANGE_GAP, 3 * R.RANGE_GAP + 50)]
    assert reads.bytes_fetched == 70 + 140 + 50 and reads.schedule([], 0, np.zeros(0), []) is None
    reads.close()
    with pytest.raises(ConfigError, match="read='direct'"):
        R.make("ranged", SimpleNamespace(store=SimpleNamespace(local=True)))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="madvise through the C library is Linux's here")
def test_a_shard_mapping_is_populated_with_the_gil_released(tmp_path, monkeypatch):
    """``map_fd`` reads a shard in with MADV_POPULATE_READ through the C library (ctypes.CDLL releases the GIL for
    the call), not ``mmap.madvise``, which holds it: a cold 256 MB populate let another Python thread run at
    0.8 M loop iterations a second against 14.4 M (measured): the Loader's fillers stopped while a window's
    shards were read."""
    import ctypes

    from dsc.store import local

    data = np.arange(1 << 20, dtype=np.uint32).view(np.uint8)
    path = tmp_path / "shard"
    path.write_bytes(data.tobytes())
    calls = []
    real = local.madvise
    monkeypatch.setattr(local, "madvise", lambda a, n, advice: calls.append((n, advice)) or real(a, n, advice))
    fd = os.open(path, os.O_RDONLY)
    try:
        got = local.map_fd(fd, len(data), path)
    finally:
        os.close(fd)
    assert np.array_equal(got, data)
    assert calls[0] == (len(data), local.MADV_POPULATE_READ)
    assert isinstance(local._libc, ctypes.CDLL) and not isinstance(local._libc, ctypes.PyDLL)  # (PyDLL keeps it)
