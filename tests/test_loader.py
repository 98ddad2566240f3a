"""dsc.Loader: orders, distributed parts, resume, clean shutdown, batches equal the dataset's."""
import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import torch

import dsc
from dsc.runtime.orders import ORDERS, partition

ORDER_NAMES = list(ORDERS)


@pytest.fixture(scope="module")
def fixed(scenes_compiled):
    return scenes_compiled(size=(12, 10), shard_size=5)


def loader_threads():
    return [t for t in threading.enumerate() if t.name.startswith("dsc-loader")]


def epoch_indices(loader):
    return np.concatenate([b["index"].numpy() for b in loader])


@pytest.mark.parametrize("order", ORDER_NAMES)
def test_each_sample_once_and_batches_equal_the_dataset(fixed, order):
    loader = dsc.Loader(fixed, batch_size=8, order=order, seed=3, window=2)
    for epoch in (0, 1):
        loader.set_epoch(epoch)
        n = 0
        for b in loader:
            ref = fixed.get_batch(b["index"].numpy())
            assert torch.equal(b["image"], ref["image"]) and torch.equal(b["label"], ref["label"])
            n += 1
        assert n == len(loader) == 5
        assert sorted(epoch_indices(loader).tolist()) == list(range(len(fixed)))


@pytest.mark.parametrize("order", ORDER_NAMES)
def test_orders_are_deterministic(fixed, order):
    a = dsc.Loader(fixed, batch_size=8, order=order, seed=1)
    b = dsc.Loader(fixed, batch_size=8, order=order, seed=1, num_threads=1, prefetch=1)
    assert np.array_equal(a.epoch_order(0), b.epoch_order(0))
    assert np.array_equal(epoch_indices(a), epoch_indices(b))
    if order != "sequential":
        assert not np.array_equal(a.epoch_order(0), a.epoch_order(1))
        assert not np.array_equal(a.epoch_order(0), dsc.Loader(fixed, batch_size=8, order=order, seed=2).epoch_order(0))


def test_quasi_random_keeps_batches_within_few_shards():
    order = ORDERS["quasi_random"](1000, 50, seed=0, epoch=0, window=2)
    assert sorted(order.tolist()) == list(range(1000))
    for a in range(0, 1000, 64):
        assert len(np.unique(order[a:a + 64] // 50)) <= 4  # a batch spans at most two windows of 2 shards
    assert not np.array_equal(order, np.sort(order))


@pytest.mark.parametrize("order", ORDER_NAMES)
@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_distributed_parts_cover_the_epoch(fixed, order, world_size):
    drop = [dsc.Loader(fixed, batch_size=4, order=order, seed=5, rank=r, world_size=world_size, tail="drop")
            for r in range(world_size)]
    parts = [np.concatenate(ld.batch_indices()) for ld in drop]
    allidx = np.concatenate(parts)
    assert len(set(len(p) for p in parts)) == 1
    assert len(np.unique(allidx)) == len(allidx) == len(fixed) // world_size * world_size  # no duplicate
    pad = [dsc.Loader(fixed, batch_size=4, order=order, seed=5, rank=r, world_size=world_size) for r in range(world_size)]
    served = [epoch_indices(ld) for ld in pad]
    assert len(set(len(p) for p in served)) == 1
    assert set(np.concatenate(served).tolist()) == set(range(len(fixed)))  # no sample missed


def test_partition_function():
    order = np.arange(10)
    assert [partition(order, r, 3, "drop").tolist() for r in range(3)] == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]
    assert [partition(order, r, 3, "pad").tolist() for r in range(3)] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 0, 1]]


GLOO_WORKER = r"""
import sys, numpy as np, torch.distributed as dist
import dsc
rank, path, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
dist.init_process_group("gloo", init_method="file://" + sys.argv[4], rank=rank, world_size=2)
for order in ("sequential", "random", "quasi_random"):
    loader = dsc.Loader(dsc.open(path), batch_size=4, order=order, seed=7, tail="drop", window=2)
    assert (loader.rank, loader.world_size) == (rank, 2)
    idx = np.concatenate([b["index"].numpy() for b in loader])
    gathered = [None, None]
    dist.all_gather_object(gathered, idx.tolist())
    if rank == 0:
        with open(out + "." + order, "w") as f:
            f.write(repr(gathered))
dist.destroy_process_group()
"""


def test_torch_distributed_gloo_two_processes(fixed, tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(GLOO_WORKER)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.getcwd(), *sys.path])}
    procs = [subprocess.Popen([sys.executable, str(script), str(r), str(fixed.path), str(tmp_path / "res"),
                               str(tmp_path / "rendezvous")], env=env) for r in range(2)]
    assert all(p.wait(timeout=120) == 0 for p in procs)
    for order in ("sequential", "random", "quasi_random"):
        a, b = eval((tmp_path / f"res.{order}").read_text())
        assert len(a) == len(b) == len(fixed) // 2
        assert len(set(a) | set(b)) == len(a) + len(b)  # disjoint, nothing duplicated


@pytest.mark.parametrize("stop_after", [0, 1, 2, 4])
def test_resume_mid_epoch_replays_the_rest_exactly(fixed, stop_after):
    full = dsc.Loader(fixed, batch_size=7, order="random", seed=11)
    full.set_epoch(2)
    want = [(b["index"].clone(), b["image"].clone()) for b in full]
    first = dsc.Loader(fixed, batch_size=7, order="random", seed=11, prefetch=4)
    first.set_epoch(2)
    got = []
    it = iter(first)
    for _ in range(stop_after):
        b = next(it)
        got.append((b["index"].clone(), b["image"].clone()))
    time.sleep(0.05)  # let the prefetch run ahead: those batches must not count as served
    state = first.state_dict()
    del it, first
    second = dsc.Loader(fixed, batch_size=7, order="random", seed=11, num_threads=1, prefetch=1)  # may differ
    second.load_state_dict(state)
    second.set_epoch(2)
    got += [(b["index"].clone(), b["image"].clone()) for b in second]
    assert len(got) == len(want)
    for (gi, gm), (wi, wm) in zip(got, want):
        assert torch.equal(gi, wi) and torch.equal(gm, wm)
    second.set_epoch(3)  # the next epoch starts from its beginning
    assert len(list(second)) == len(second)


def test_resume_refuses_a_different_order(fixed):
    state = dsc.Loader(fixed, batch_size=7, order="random", seed=11).state_dict()
    with pytest.raises(dsc.DscError, match="seed=11"):
        dsc.Loader(fixed, batch_size=7, order="random", seed=12).load_state_dict(state)


def test_kept_batches_stay_valid(fixed):
    loader = dsc.Loader(fixed, batch_size=4, order="random", prefetch=1)
    batches = list(loader)  # holding every batch: the ring must not overwrite them
    for b in batches:
        assert torch.equal(b["image"], fixed.get_batch(b["index"].numpy())["image"])


def test_ring_buffers_are_reused_when_batches_are_dropped(fixed):
    loader = dsc.Loader(fixed, batch_size=4, order="random", prefetch=1, num_threads=1)
    ptrs = set()
    for b in loader:
        ptrs.add(b["image"].data_ptr())
        del b
    assert len(ptrs) <= 3  # prefetch + 2 slots


@pytest.mark.parametrize("how", ["break", "del", "exception", "keyboardinterrupt"])
def test_no_thread_left_behind(fixed, how):
    loader = dsc.Loader(fixed, batch_size=2, order="random", prefetch=2, num_threads=2)
    try:
        for k, _ in enumerate(loader):
            if k == 2:
                if how == "break":
                    break
                if how == "exception":
                    raise ValueError("consumer failed")
                if how == "keyboardinterrupt":
                    raise KeyboardInterrupt
                if how == "del":
                    del loader
                    break
    except (ValueError, KeyboardInterrupt):
        pass
    for _ in range(50):
        if not loader_threads():
            break
        time.sleep(0.02)
    assert not loader_threads()
    if how != "del":  # an interrupted epoch keeps the ring for the next one (no unpin / re-pin) ...
        assert loader._ring is not None and next(iter(loader)) is not None
        loader.close()  # ... until close() releases it
        assert loader._ring is None and not loader_threads()


def test_errors_in_threads_reach_the_consumer(fixed, monkeypatch):
    loader = dsc.Loader(fixed, batch_size=4)

    def boom(*a, **k):
        raise OSError("disk on fire")

    monkeypatch.setattr(fixed, "get_batch", boom)
    with pytest.raises(OSError, match="disk on fire"):
        list(loader)
    assert not loader_threads()


def test_cache_ram_gives_the_same_batches(fixed, tmp_path):
    a = dsc.Loader(dsc.open(fixed.path), batch_size=8, order="random", cache="ram")
    b = dsc.Loader(fixed, batch_size=8, order="random")
    for x, y in zip(a, b):
        assert torch.equal(x["image"], y["image"])
    maps = a.dataset.storage._maps
    assert maps and all(m.base is None for m in maps.values())  # process memory, not file mappings


def test_drop_last_and_len(fixed):
    loader = dsc.Loader(fixed, batch_size=8, drop_last=True)
    assert len(loader) == 4 and all(len(b["index"]) == 8 for b in loader)


def test_cuda_refused_clearly_without_a_gpu(fixed):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(dsc.DscError, match="CUDA is not available"):
        dsc.Loader(fixed, batch_size=4, device="cuda")


def test_detection_and_ragged_batches(tmp_path):
    from dsc.synthetic import detection_scenes, write_coco

    ann, images = write_coco(tmp_path / "coco", detection_scenes(10, seed=1))
    dsc.compile_coco(ann, images, tmp_path / "d", max_side=64, shard_size=3, progress=False)
    ds = dsc.open(tmp_path / "d")
    for form in ("packed", "padded", "list"):
        loader = dsc.Loader(ds, batch_size=4, order="random", boxes=form, images="padded")
        for b in loader:
            ref = ds.get_batch(b["index"].numpy(), boxes=form, images="padded")
            assert torch.equal(b["image"], ref["image"])
            if form == "list":
                assert all(torch.equal(x["boxes"], y["boxes"]) for x, y in zip(b["targets"], ref["targets"]))
            else:
                assert torch.equal(b["boxes"], ref["boxes"])
    packed = dsc.Loader(ds, batch_size=4, images="packed")
    assert sum(int(b["box_offsets"][-1]) for b in packed) == ds.manifest.objects["num_boxes"]


def _rss_anon_kb():
    with open("/proc/self/status") as f:
        return int(next(line for line in f if line.startswith("RssAnon")).split()[1])


def test_reading_does_not_copy_the_dataset_into_process_memory(scenes_src, tmp_path):
    dsc.compile_imagefolder(scenes_src, tmp_path / "big", size=(256, 256), shard_size=12, progress=False)
    ds = dsc.open(tmp_path / "big")  # 36 x 196 kB = 7 MB of pixels
    before = _rss_anon_kb()
    total = sum(int(ds[i]["image"][::16, ::16].sum()) for i in range(len(ds)))  # touch every shard
    assert total > 0
    assert _rss_anon_kb() - before < 2000, "mapped shards must stay page-cache pages, not private copies"


def test_kept_batches_do_not_inflate_the_ring(fixed):
    loader = dsc.Loader(fixed, batch_size=4, order="random", prefetch=1)
    kept = [list(loader) for _ in range(3)]  # hold three epochs of batches
    need = sum(b["image"].numel() for epoch in kept for b in epoch)
    storages = {b["image"].untyped_storage().data_ptr(): b["image"].untyped_storage().nbytes()
                for epoch in kept for b in epoch}
    assert sum(storages.values()) <= need * 1.3


def test_a_second_iteration_makes_the_first_raise(fixed):
    loader = dsc.Loader(fixed, batch_size=4)
    outer = iter(loader)
    next(outer)
    assert len(list(loader)) == len(loader)  # the new iteration runs a whole epoch
    with pytest.raises(dsc.DscError, match="new iteration"):
        next(outer)


def test_a_thread_failure_outside_a_batch_reaches_the_consumer(fixed):
    if torch.cuda.is_available():
        pytest.skip("needs a machine without CUDA to make stream creation fail")
    loader = dsc.Loader(fixed, batch_size=4)
    loader.device = torch.device("cuda")  # stream creation fails in the filler threads
    t0 = time.monotonic()
    with pytest.raises(dsc.DscError, match="threads failed"):
        next(iter(loader))
    assert time.monotonic() - t0 < 10
    assert not loader_threads()


def test_loader_argument_checks(fixed):
    with pytest.raises(dsc.DscError, match="leaves every rank empty"):
        dsc.Loader(fixed, batch_size=4, world_size=100, rank=0, tail="drop")
    with pytest.raises(dsc.DscError, match="seed"):
        dsc.Loader(fixed, batch_size=4, seed=-1)
    with pytest.raises(dsc.DscError, match="window"):
        dsc.Loader(fixed, batch_size=4, order="quasi_random", window=0)
    a = dsc.Loader(fixed, batch_size=4, order="quasi_random")
    b = dsc.Loader(fixed, batch_size=4, order="quasi_random", window=8)
    b.load_state_dict(a.state_dict())  # the default window is the same order


def test_resume_refuses_another_dataset(fixed, scenes_src, tmp_path):
    dsc.compile_imagefolder(scenes_src, tmp_path / "other", size=(12, 10), shard_size=6, progress=False)
    state = dsc.Loader(fixed, batch_size=4).state_dict()
    with pytest.raises(dsc.DscError, match="shard_size"):
        dsc.Loader(dsc.open(tmp_path / "other"), batch_size=4).load_state_dict(state)


def test_empty_batch(fixed):
    b = fixed.get_batch([])
    assert b["image"].shape == (0, 12, 10, 3) and b["label"].shape == (0,)
