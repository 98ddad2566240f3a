"""Elastic resume: a state saved on N ranks resumes on M; the epoch's global order does not depend on the world
size, and the resumed ranks split exactly what the saved run had not served."""
import itertools

import numpy as np
import pytest

import dsc
from dsc.runtime.orders import ORDERS
from dsc.runtime.orders.partition import partition, remaining

ORDER_NAMES = list(ORDERS)


@pytest.fixture(scope="module")
def fixed(scenes_compiled):
    return scenes_compiled(size=(12, 10), shard_size=5)  # 36 samples


def run_in_stages(data, plan, order, batch_size=2, tail="pad", drop_last=False, **kw):
    """Serve one epoch in runs: ``plan`` is [(world_size, batches each rank serves or None: to the end[, batch
    size]), ...],
    every run resumed from the state the previous one saved (rank 0's; the ranks step together). Returns the
    samples each run served (every rank's, as (source, index) where the batches say the source)."""
    state, runs = None, []
    for world_size, cut, *bs in plan:
        loaders = [dsc.Loader(data, batch_size=bs[0] if bs else batch_size, order=order, seed=4, rank=r, world_size=world_size,
                              tail=tail, drop_last=drop_last, num_threads=0, **kw) for r in range(world_size)]
        for loader in loaders:
            if state is None:
                loader.set_epoch(1)
            else:
                loader.load_state_dict(state)
        served = []
        for loader in loaders:
            it = iter(loader)
            for _, b in zip(range(cut) if cut is not None else itertools.count(), it):
                src = b["source"].tolist() if "source" in b else [0] * len(b["index"])
                served += list(zip(src, b["index"].tolist()))
            if loader is loaders[0]:
                state = loader.state_dict()
            it.close()
        assert len({len(loader) for loader in loaders}) == 1  # every rank as many batches
        runs.append(served)
    return runs


def check_exact(runs, everything, tail, sizes):
    """Every sample served (tail="pad"); none twice, except the padding of ``tail="pad"``: fewer repeats than the
    runs have ranks, and none across a change of world size (the resumed ranks split what was not served)."""
    served = [s for run in runs for s in run]
    if tail == "pad":
        assert set(served) == everything
        assert len(served) - len(set(served)) < sum(sizes)
        for (w0, run0), (w1, run1) in zip(zip(sizes, runs), zip(sizes[1:], runs[1:])):
            if w0 != w1:
                assert not set(run0) & set(run1), "a sample was served again after the resume"
    else:
        assert len(served) == len(set(served)), "a sample was served twice"
        assert len(everything) - len(served) < sum(sizes)  # the tail each run's world size cuts


def test_every_pair_of_world_sizes_resumes_exactly(fixed):
    """Every pair of world sizes 1-8, both tails, through real Loaders (the order does not enter the arithmetic of
    what is left: every order is run in the 8 -> 3 -> 5 test, and every pair at the level of the order below)."""
    everything = {(0, i) for i in range(len(fixed))}
    order = "quasi_random"
    for a, b in itertools.product(range(1, 9), repeat=2):
        for tail in ("pad", "drop"):
            runs = run_in_stages(fixed, [(a, 1), (b, None)], order, tail=tail)
            check_exact(runs, everything, tail, (a, b))


@pytest.mark.parametrize("order", ORDER_NAMES)
def test_resume_8_then_3_then_5_ranks(fixed, order):
    everything = {(0, i) for i in range(len(fixed))}
    runs = run_in_stages(fixed, [(8, 1), (3, 2), (5, None)], order, batch_size=1)
    assert [len(r) for r in runs][:2] == [8, 6]
    check_exact(runs, everything, "pad", (8, 3, 5))
    runs = run_in_stages(fixed, [(8, 1), (3, 1), (5, None)], order, batch_size=1, tail="drop")
    check_exact(runs, everything, "drop", (8, 3, 5))


def test_the_batch_size_may_change_on_resume(fixed):
    everything = {(0, i) for i in range(len(fixed))}
    for order in ORDER_NAMES:
        runs = run_in_stages(fixed, [(2, 2, 4), (3, 3, 1), (1, None, 5)], order)
        assert [len(r) for r in runs][:2] == [16, 9]
        check_exact(runs, everything, "pad", (2, 3, 1))


def test_the_global_order_does_not_depend_on_the_world_size(fixed):
    for order in ORDER_NAMES:
        whole = [np.concatenate([dsc.Loader(fixed, batch_size=3, order=order, seed=9, rank=r, world_size=w,
                                            tail="drop").epoch_order(2) for r in range(w)]) for w in (1, 2, 3, 4, 6)]
        for w in whole[1:]:
            assert np.array_equal(w, whole[0][:len(w)])


@pytest.mark.parametrize("order", ORDER_NAMES)
def test_remaining_is_a_pure_function_of_what_was_served(order):
    order = ORDERS[order](1000, 50, seed=0, epoch=3)
    for n_, m_ in itertools.product(range(1, 9), repeat=2):
        for tail in ("pad", "drop"):
            taken = 37
            first = np.concatenate([partition(order, r, n_, tail)[:taken] for r in range(n_)])
            rest = remaining(order, [(n_, taken, tail)])
            assert not set(first.tolist()) & set(rest.tolist())
            assert set(first.tolist()) | set(rest.tolist()) == set(order.tolist()) or tail == "drop"
            parts = [partition(rest, r, m_, tail) for r in range(m_)]
            if tail == "drop":
                assert len(np.unique(np.concatenate(parts))) == len(rest) // m_ * m_


def test_a_same_layout_resume_is_the_uninterrupted_run(fixed):
    kw = dict(batch_size=4, order="random", seed=2, rank=1, world_size=3)
    want = [b["index"].tolist() for b in dsc.Loader(fixed, **kw)]
    a = dsc.Loader(fixed, **kw)
    it = iter(a)
    got = [next(it)["index"].tolist()]
    b = dsc.Loader(fixed, **{**kw, "rank": 2})  # any rank's state resumes any rank
    b.load_state_dict(a.state_dict())
    c = dsc.Loader(fixed, **kw)
    c.load_state_dict(b.state_dict())
    got += [x["index"].tolist() for x in c]
    assert got == want


def test_a_bad_or_foreign_state_is_refused(fixed, tmp_path):
    state = dsc.Loader(fixed, batch_size=4, world_size=8, rank=3).state_dict()
    loader = dsc.Loader(fixed, batch_size=4, world_size=2)
    loader.load_state_dict(state)  # another world size: fine
    with pytest.raises(dsc.ConfigError, match="stages"):
        loader.load_state_dict({**state, "stages": [[0, 1]]})
    with pytest.raises(dsc.ConfigError, match="seed"):
        loader.load_state_dict({**state, "seed": 1})
    with pytest.raises(dsc.ConfigError, match="served 99 batches"):
        loader.load_state_dict({**state, "batches_served": 99})
    old = {k: v for k, v in state.items() if k != "stages"}  # a state written before elastic resume: still read
    loader.load_state_dict({**old, "batches_served": 1})
    assert (len(loader), loader.samples_per_rank()) == (1, 4)  # 7 left (8 ranks x 4 served, 3 of them pads)


@pytest.fixture(scope="module")
def second(tmp_path_factory):
    from dsc.synthetic import write_imagefolder

    root = tmp_path_factory.mktemp("elastic-b")
    write_imagefolder(root / "src", num_classes=2, per_class=7, size_range=(40, 60), seed=8)
    dsc.compile(root / "src", root / "b", size=(12, 10), shard_size=3, progress=False)
    return dsc.open(root / "b")  # 14 samples


@pytest.mark.parametrize("order", ORDER_NAMES)
def test_a_mixture_resumes_on_any_world_size(fixed, second, order):
    everything = {(0, i) for i in range(36)} | {(1, i) for i in range(14)}
    for a, b in itertools.product(range(1, 9), repeat=2):
        if order == "random" or (a + b) % 5 == 0:  # (every pair in one order, a spread of them in the others)
            runs = run_in_stages([fixed, second], [(a, 1), (b, None)], order, batch_size=2)
            check_exact(runs, everything, "pad", (a, b))
    runs = run_in_stages([fixed, second], [(8, 1), (3, 2), (5, None)], order, batch_size=1)
    check_exact(runs, everything, "pad", (8, 3, 5))
    runs = run_in_stages([fixed, second], [(8, 1), (3, 1), (5, None)], order, batch_size=2, tail="drop")
    check_exact(runs, everything, "drop", (8, 3, 5))
    # weighted, up-sampled: the epoch's (source, index, repeat) is served once across the runs
    runs = run_in_stages([fixed, second], [(4, 2), (3, None)], order, batch_size=2, weights=[1, 1], epoch_size=60,
                         tail="drop")
    first, rest = runs
    assert len(first) + len(rest) > 60 - 3 - 4 and len(first) == 16


def test_one_source_per_batch_resumes_on_another_world_size(fixed, second):
    everything = {(0, i) for i in range(36)} | {(1, i) for i in range(14)}
    for order in ORDER_NAMES:
        for a, b in ((1, 2), (2, 1), (3, 5), (5, 3), (4, 4)):
            runs = run_in_stages([fixed, second], [(a, 1), (b, None)], order, batch_size=3, tail="drop",
                                 one_source_per_batch=True)
            served = [s for r in runs for s in r]
            assert len(served) == len(set(served))
            assert len(everything) - len(served) < 3 * (a + b)  # whole batches cut by tail="drop"
    with pytest.raises(dsc.ConfigError, match="one source per batch"):
        state = dsc.Loader([fixed, second], batch_size=3, one_source_per_batch=True).state_dict()
        dsc.Loader([fixed, second], batch_size=4, one_source_per_batch=True).load_state_dict(state)
