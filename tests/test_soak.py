"""Readers and a writer that is killed: a kill during the plain-Zarr view's refresh never tears the view, and a
bounded soak (readers checking every sample against an oracle while a writer updates, restores, tags and
vacuums the dataset and is SIGKILLed at random moments) finds 0 wrong samples and 0 lost versions."""
import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import dsc
from dsc.formats import versions as V
from dsc.formats import view

zarr = pytest.importorskip("zarr")
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([os.getcwd(), *sys.path])}
OPTS = dict(size=8, shard_size=16, workers=1, progress=False)


def pixels(seed: int) -> np.ndarray:
    """Sample ``c<k>/s<seed>.png``'s pixels: 8x8 PNGs compiled at size 8 are stored as they are."""
    return np.random.default_rng(seed).integers(0, 256, (8, 8, 3), dtype=np.uint8)


def put(src: Path, seed: int, cls: int) -> str:
    key = f"c{cls}/s{seed}.png"
    (src / key).parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(pixels(seed)).save(src / key)
    return key


def plain(out: Path, each_array: bool = False) -> dict:
    """Every array of the view as zarr-python reads it by default (through the root's consolidated metadata
    when it has some), or as a reader that opens each array through its own zarr.json."""
    names = ["image", "label", "keys", "live", "transform/orig_size", "transform/affine", "transform/exif_orientation",
             "checksums/crc32c", "inputs/fingerprint"]
    if each_array:
        return {name: zarr.open_array(out / name, mode="r")[:] for name in names}
    g = zarr.open_group(out, mode="r")
    return {name: g[name][:] for name in names}


def same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


# ----------------------------------------------------------------------------- the view under kills
def test_a_kill_at_any_step_of_the_view_refresh_leaves_one_version_in_the_view(tmp_path, monkeypatch):
    """An update from 150 to 212 rows, stopped before each file the view refresh writes in turn: zarr-python
    sees the old view or the new one, whole, never arrays of both; an array read through its own zarr.json
    is always readable and one version's; the next writer finishes the view."""
    src, out = tmp_path / "src", tmp_path / "out"
    for s in range(150):
        put(src, s, s % 3)
    dsc.compile_imagefolder(src, out, **OPTS)
    pristine = tmp_path / "pristine"
    shutil.copytree(out, pristine)
    old = plain(out)
    for s in range(150, 212):
        put(src, s, s % 3)
    calls = {"n": 0, "stop": None, "on": False}
    real_replace, real_refresh = os.replace, view.refresh

    def replace(*a, **kw):  # every file of the view is published by a rename
        if calls["on"]:
            if calls["n"] == calls["stop"]:
                raise KeyboardInterrupt("killed")
            calls["n"] += 1
        return real_replace(*a, **kw)

    def refresh(*a, **kw):
        calls["on"] = True
        try:
            return real_refresh(*a, **kw)
        finally:
            calls["on"] = False
    monkeypatch.setattr(os, "replace", replace)
    monkeypatch.setattr(view, "refresh", refresh)
    dsc.compile_imagefolder(src, out, update=True, **OPTS)
    new, steps = plain(out), calls["n"]
    assert len(new["live"]) > len(old["live"]) and steps > 10
    seen = set()
    for k in range(steps):
        shutil.rmtree(out)
        shutil.copytree(pristine, out)
        calls.update(n=0, stop=k)
        with pytest.raises(KeyboardInterrupt):
            dsc.compile_imagefolder(src, out, update=True, **OPTS)
        got = plain(out)
        assert same(got, old) or same(got, new), f"stopped before file {k} of {steps}: a torn view"
        seen.add("old" if same(got, old) else "new")
        per_array = plain(out, each_array=True)  # a reader that ignores the consolidated metadata
        for name, a in per_array.items():
            assert np.array_equal(a, old[name]) or np.array_equal(a, new[name]), (k, name)
        assert dsc.open(out).version == 1 and not dsc.verify(out).ok  # committed; the view is stale
        calls["stop"] = None
        assert not dsc.compile_imagefolder(src, out, update=True, **OPTS).committed  # the next writer...
        assert same(plain(out), new) and dsc.verify(out).ok  # ...finishes the view
    assert seen == {"old"}  # only the last rename (the root) switches it


def test_vacuum_never_removes_the_version_the_view_shows(tmp_path, monkeypatch):
    """A writer killed between its commit and the view refresh leaves the view on the previous version; a
    vacuum that removes that version first brings the view to the latest, so plain readers never read a
    version whose shards are gone."""
    src, out = tmp_path / "src", tmp_path / "out"
    for s in range(40):
        put(src, s, s % 3)
    dsc.compile_imagefolder(src, out, **OPTS)
    keys = dsc.open(out).keys
    for key in keys[:16]:  # slot 0's samples: only version 0 uses the slot
        (src / key).unlink()

    def killed(*a, **kw):
        raise KeyboardInterrupt("killed")
    monkeypatch.setattr(view, "refresh", killed)
    with pytest.raises(KeyboardInterrupt):
        dsc.compile_imagefolder(src, out, update=True, **OPTS)
    monkeypatch.undo()
    assert zarr.open_group(out, mode="r").attrs["dsc"]["version"]["number"] == 0  # the view: still version 0
    assert dsc.vacuum(out, keep=1, older_than=0).removed == [0] and not (out / "image" / "c" / "0").exists()
    g = zarr.open_group(out, mode="r")
    live = np.flatnonzero(g["live"][:])
    assert g.attrs["dsc"]["version"]["number"] == 1 and sorted(g["keys"][:][live]) == sorted(keys[16:])
    assert all(np.array_equal(img, pixels(int(k.split("/s")[1][:-4])))
               for k, img in zip(g["keys"][:][live], g["image"][:][live]))
    assert dsc.verify(out).ok


# ----------------------------------------------------------------------------- the soak
READER = r'''
import hashlib, json, os, sys
import numpy as np
import dsc
from dsc.formats import versions as V

out, stop, results, kind, seed = sys.argv[1:]
rng = np.random.default_rng(int(seed))


def pixels(seed):
    return np.random.default_rng(seed).integers(0, 256, (8, 8, 3), dtype=np.uint8)


def wrong(keys, images, labels):
    """Samples whose pixels or label are not what their key says (c<label>/s<seed>.png)."""
    bad = 0
    for k, img, lab in zip(keys, images, labels):
        cls, name = str(k).split("/")
        bad += int(cls[1:]) != int(lab) or not np.array_equal(img, pixels(int(name[1:-4])))
    return bad


def digest(keys):
    return hashlib.sha256("\n".join(sorted(map(str, keys))).encode()).hexdigest()


def root():
    with open(os.path.join(out, "zarr.json"), "rb") as f:
        return f.read()


with open(results, "a") as log:
    print(json.dumps({"ready": kind}), file=log, flush=True)
    while not os.path.exists(stop):
        try:
            if kind == "dsc":  # the latest, or any version in the log (a vacuum may remove it meanwhile)
                have = V.versions(V.Root(out))
                want = int(rng.choice(have)) if rng.random() < 0.3 else None
                ds = dsc.open(out, version=want)
                order = rng.permutation(len(ds))
                b = ds.get_batch(order)
                keys = [ds.keys[i] for i in order]
                rec = {"version": ds.version, "keys": digest(keys), "n": len(keys),
                       "wrong": wrong(keys, b["image"].numpy(), b["label"].numpy())}
                del ds, b
            else:  # a plain Zarr reader of the view
                import zarr

                before = root()
                try:
                    g = zarr.open_group(out, mode="r")
                    arrays = {n: g[n][:] for n in ("live", "keys", "label", "image", "transform/affine")}
                    version = g.attrs["dsc"]["version"]["number"]
                except Exception as e:
                    arrays, version = repr(e), None
                if root() != before:  # a writer switched the view while it was read: not a verdict
                    rec = {"overtaken": True}
                elif version is None:
                    rec = {"error": arrays}
                else:
                    rows = np.flatnonzero(arrays["live"])
                    torn = len({len(a) for a in arrays.values()}) != 1
                    rec = {"version": version, "view": True, "torn": torn, "n": len(rows), "keys": digest(
                        arrays["keys"][rows]), "wrong": wrong(arrays["keys"][rows], arrays["image"][rows],
                                                              arrays["label"][rows])}
        except dsc.VersionNotFoundError as e:
            rec = {"gone": str(e)}
        except Exception as e:
            rec = {"error": repr(e)}
        print(json.dumps(rec), file=log, flush=True)
'''


def _digest(keys) -> str:
    return hashlib.sha256("\n".join(sorted(keys)).encode()).hexdigest()


class Writer:
    """Runs one writer operation in a forked child (no interpreter start: a kill can land anywhere in it) and
    SIGKILLs it at a random moment of its usual duration, or lets it finish."""

    def __init__(self, out: Path, errors: Path, rng: random.Random):
        self.out, self.errors, self.rng = out, errors, rng
        self.took: dict[str, float] = {}
        self.kills = self.runs = 0

    def run(self, name: str, fn, kill: bool) -> bool:
        """Whether the operation was killed before it ended."""
        t0 = time.monotonic()
        pid = os.fork()
        if pid == 0:  # the child: the operation, then out without running anything of the parent's
            code = 0
            try:
                fn()
            except BaseException as e:
                with open(self.errors, "a") as f:
                    f.write(f"{name}: {e!r}\n")
                code = 1
            finally:
                os._exit(code)
        deadline = t0 + self.rng.uniform(0, 1.3 * self.took.get(name, 0.2)) if kill else float("inf")
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            if time.monotonic() - t0 > 120:  # a writer stuck (not a kill of the soak's): fail, never hang
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                raise AssertionError(f"the {name} writer ran for 2 minutes without finishing")
            if time.monotonic() >= deadline:
                os.kill(pid, signal.SIGKILL)
                _, status = os.waitpid(pid, 0)
                break
            time.sleep(0.001)
        self.runs += 1
        if os.WIFSIGNALED(status):
            assert os.WTERMSIG(status) == signal.SIGKILL
            self.kills += 1
            return True
        assert os.WEXITSTATUS(status) == 0, self.errors.read_text()
        took = time.monotonic() - t0
        self.took[name] = took if name not in self.took else 0.7 * self.took[name] + 0.3 * took
        return False


def _quiet_tqdm_monitor() -> None:
    """The writer is forked from this (threaded) test process: tqdm's monitor thread, started by any earlier
    progress bar of the session, takes tqdm's lock every few seconds, and a fork while it holds it leaves
    the child's copy locked forever (the child's first progress bar would wait on it)."""
    import tqdm

    tqdm.tqdm.monitor_interval = 0
    if tqdm.tqdm.monitor is not None:
        tqdm.tqdm.monitor.exit()
        tqdm.tqdm.monitor = None


def test_soak_readers_see_only_committed_content_while_a_writer_is_killed(tmp_path):
    _quiet_tqdm_monitor()
    rng = random.Random(26)
    src, out = tmp_path / "src", tmp_path / "out"
    source = {}  # key -> seed: what the next update compiles
    for s in range(120):
        source[put(src, s, s % 3)] = s
    dsc.compile_imagefolder(src, out, **OPTS)
    oracle = {0: frozenset(source)}  # version -> its keys (each key's pixels and label follow from its name)
    tags: dict[str, int] = {}
    stop, results = tmp_path / "stop", tmp_path / "results"
    script = tmp_path / "reader.py"
    script.write_text(READER)
    readers = [subprocess.Popen([sys.executable, str(script), str(out), str(stop), str(results) + f".{kind}", kind,
                                 str(i)], env=ENV) for i, kind in enumerate(["dsc", "zarr"])]
    writer = Writer(out, tmp_path / "writer-errors", rng)
    next_seed, kinds = 1000, {"update": 5, "restore": 2, "vacuum": 2, "tag": 1}
    try:
        t = time.monotonic()
        while not all(Path(f"{results}.{k}").exists() for k in ("dsc", "zarr")):
            assert time.monotonic() - t < 60 and all(p.poll() is None for p in readers), "the readers did not start"
            time.sleep(0.05)
        def readings_so_far() -> tuple[int, int]:  # (readings, of them of the plain view) the readers reported
            lines = [line for k in ("dsc", "zarr") for line in Path(f"{results}.{k}").read_text().splitlines()]
            return sum('"version"' in line for line in lines), sum('"view": true' in line for line in lines)

        t0 = time.monotonic()  # until what the final check counts is there (a few seconds; at most 50)
        while time.monotonic() - t0 < 50 and (writer.kills < 12 or len(oracle) < 12
                                              or (lambda r, v: r < 24 or v < 6)(*readings_so_far())):
            before = V.versions(V.Root(out))
            op = rng.choices(list(kinds), weights=list(kinds.values()))[0]
            kill = rng.random() < 0.6
            if op == "update":  # the source changes: new images, removed ones, images moved to another class
                for _ in range(rng.randint(1, 12)):
                    source[put(src, next_seed, rng.randrange(3))] = next_seed
                    next_seed += 1
                for key in rng.sample(sorted(source), rng.randint(0, 6)):
                    if sum(k.startswith(key[:3]) for k in source) > 3:  # every class keeps images
                        (src / key).unlink()
                        del source[key]
                for key in rng.sample(sorted(source), rng.randint(0, 3)):
                    if sum(k.startswith(key[:3]) for k in source) > 3:
                        moved = f"c{(int(key[1]) + 1) % 3}/{key.split('/')[1]}"
                        os.rename(src / key, src / moved)
                        source[moved] = source.pop(key)
                writer.run(op, lambda: dsc.compile_imagefolder(src, out, update=True, **OPTS), kill)
            elif op == "restore":
                k = rng.choice(before)
                writer.run(op, lambda: dsc.restore(out, version=k), kill)
            elif op == "vacuum":
                writer.run(op, lambda: dsc.vacuum(out, keep=2, older_than=0), kill)
            else:
                name, k = f"t{rng.randrange(3)}", rng.choice(before)
                writer.run(op, lambda: dsc.tag(out, name, version=k), kill)
            after = V.versions(V.Root(out))
            new = [n for n in after if n > before[-1]]
            assert len(new) <= 1 and (not new or new[0] == before[-1] + 1), (op, before, after)
            if new:
                assert op in ("update", "restore"), (op, new)
                oracle[new[0]] = frozenset(source) if op == "update" else oracle[k]
            tags = V.tag_names(V.Root(out))
            kept = set(before[-2:]) | set(tags.values())
            lost = set(before) - set(after)
            assert not lost or (op == "vacuum" and not lost & kept), (op, sorted(lost), before, after)
    finally:
        stop.write_text("stop")
        for p in readers:
            p.wait(60)
    # every reading was of a committed version, complete, every sample right; the plain view never torn
    recs = [json.loads(line) for k in ("dsc", "zarr") for line in Path(f"{results}.{k}").read_text().splitlines()]
    assert not [r for r in recs if "error" in r or r.get("wrong") or r.get("torn")], recs[:5]
    readings = [r for r in recs if "version" in r]
    for r in readings:
        assert r["keys"] == _digest(oracle[r["version"]]), r
    samples = sum(r["n"] for r in readings)
    views = sum(1 for r in readings if r.get("view"))
    # every version still in the log holds what it was committed with; tagged ones were all kept
    have = V.versions(V.Root(out))
    for n in have:
        ds = dsc.open(out, version=n)
        b = ds.get_batch(range(len(ds)))
        assert set(ds.keys) == oracle[n]
        for i, key in enumerate(ds.keys):
            assert np.array_equal(b["image"][i].numpy(), pixels(int(key.split("/s")[1][:-4])))
            assert int(b["label"][i]) == int(key[1])
        assert dsc.verify(out, version=n).ok or n == have[-1]
    assert set(tags.values()) <= set(have)
    report = dsc.verify(out)  # a writer killed after its commit leaves a stale view at worst
    assert report.ok or all(p.view for p in report.problems)
    print(f"soak: {writer.runs} writer runs, {writer.kills} killed, {len(oracle)} versions committed "
          f"({len(have)} kept), {len(readings)} readings ({views} of the plain view; "
          f"{sum('overtaken' in r for r in recs)} more overtaken by a switch, {sum('gone' in r for r in recs)} of a "
          f"version vacuumed meanwhile) checking {samples:,} samples")
    assert writer.kills >= 12 and len(oracle) >= 12 and len(readings) >= 20 and views >= 5
