"""Crash safety: SIGKILL at random points then --resume gives byte-identical shards; OUT is never
presented before it is complete; a second compile into the same OUT is refused; a full disk gives a
clear error and a resumable partial; verify detects every flipped byte and names the samples."""
import os
import resource
import shutil
import signal
import subprocess
import sys
import time
import zlib
from pathlib import Path

import numpy as np
import pytest

import dsc
from conftest import DecodeCounter, journal_units, stopped_at_unit, tree_bytes
from damage import edit_manifest
from dsc.formats.verify import verify
from dsc.formats import versions as V

ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([os.getcwd(), *sys.path])}


@pytest.fixture(scope="module")
def slow_src(tmp_path_factory):
    """Enough JPEGs that a compile takes a couple of seconds on 2 cores."""
    from dsc.synthetic import write_imagefolder

    root = tmp_path_factory.mktemp("slow") / "src"
    write_imagefolder(root, num_classes=4, per_class=60, size_range=(300, 420), seed=5, quality=92)
    return root


def compile_cmd(src, out, *extra):
    return [sys.executable, "-m", "dsc.cli", "compile", "imagefolder", str(src), str(out), "--size", "96",
            "--shard-size", "6", "--workers", "2", "-q", *extra]


@pytest.fixture(scope="module")
def reference_tree(slow_src, tmp_path_factory):
    out = tmp_path_factory.mktemp("ref") / "out"
    subprocess.run(compile_cmd(slow_src, out), check=True, env=ENV)
    return tree_bytes(out)


def _units_done(out):
    from dsc.compiler.journal import Journal

    return len(Journal.units_in(out.parent / f".{out.name}.dsc-tmp"))


def _run_and_kill(cmd, out, after_units, whole_group=True, timeout=60.0):
    """Start a compile, SIGKILL it once the journal holds ``after_units`` finished units."""
    p = subprocess.Popen(cmd, env=ENV, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    t_end = time.monotonic() + timeout
    while time.monotonic() < t_end and p.poll() is None:
        if out.exists():  # the rename is the last step: if OUT exists it is complete
            dsc.open(out)
        if _units_done(out) >= after_units:
            break
        time.sleep(0.002)
    if p.poll() is None:
        if whole_group:
            os.killpg(p.pid, signal.SIGKILL)  # power loss: the parent and its workers die at once
        else:
            p.send_signal(signal.SIGKILL)  # only the parent: its workers must follow (PR_SET_PDEATHSIG)
    p.communicate()
    return p.returncode


def test_sigkill_at_random_points_then_resume_is_byte_identical(slow_src, reference_tree, tmp_path):
    out = tmp_path / "out"
    rng = np.random.default_rng(7)
    targets = sorted(int(t) for t in rng.integers(1, 38, 4))
    for _ in range(3):  # a stalled poller may let a compile finish before its kill: then again from scratch
        shutil.rmtree(out, ignore_errors=True)
        shutil.rmtree(tmp_path / ".out.dsc-tmp", ignore_errors=True)
        kills = 0
        for attempt, target in enumerate(targets):
            extra = ("--resume",) if attempt else ()
            code = _run_and_kill(compile_cmd(slow_src, out, *extra), out, target, whole_group=attempt % 2 == 0)
            if code == 0 or out.exists():  # finished, or killed after its publishing rename: OUT is complete
                assert verify(out).ok
                break
            kills += 1
            for _ in range(100):  # after a parent-only kill, its workers die with it and release the lock
                if not any(p.name == ".out.dsc-lock" for p in tmp_path.iterdir()) or _lock_free(tmp_path):
                    break
                time.sleep(0.05)
        if kills >= 2:
            break
    assert kills >= 2, "the compile finished before the kills three times; the test did not test anything"
    if not out.exists():
        subprocess.run(compile_cmd(slow_src, out, "--resume"), check=True, env=ENV, capture_output=True)
    assert tree_bytes(out) == reference_tree
    assert not (tmp_path / ".out.dsc-tmp").exists() and not (tmp_path / ".out.dsc-lock").exists()
    assert verify(out).ok


def _lock_free(d):
    import fcntl

    fd = os.open(d / ".out.dsc-lock", os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)


def _interrupted_compile(src, out, monkeypatch, **options):
    """A compile stopped at its very end (its publish), in this process: the staging keeps every unit's
    journal, as a kill just before the rename would (deterministic, unlike timing a SIGKILL)."""
    from dsc.compiler import staging

    def stop(*a, **kw):
        raise KeyboardInterrupt("killed")
    with monkeypatch.context() as m:
        m.setattr(staging.Staging, "publish", stop)
        with pytest.raises(KeyboardInterrupt):
            dsc.compile_imagefolder(src, out, progress=False, **options)
    assert not out.exists() and _units_done(out) > 0


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL], ids=["ctrl-c", "kill-9"])
def test_resume_keeps_the_finished_units_and_decodes_only_the_rest(slow_src, reference_tree, tmp_path, monkeypatch,
                                                                  sig):
    """Ctrl-C or kill -9 once 15 of the 40 units are journaled: --resume keeps those 15 (reported) and decodes
    exactly the images of the other 25 units, counted in every worker; the result is byte-identical."""
    from click.testing import CliRunner

    from dsc.cli import main

    out = tmp_path / "out"
    r = stopped_at_unit(compile_cmd(slow_src, out)[3:], 15, sig)
    assert r.returncode == (130 if sig == signal.SIGINT else -signal.SIGKILL), r.stderr
    if sig == signal.SIGINT:
        assert "Traceback" not in r.stderr and "rerun the same command with --resume" in r.stderr, r.stderr
    kept = journal_units(tmp_path / ".out.dsc-tmp")
    assert len(kept) == 15 and not out.exists()
    counter = DecodeCounter(monkeypatch, tmp_path)
    res = CliRunner().invoke(main, compile_cmd(slow_src, out, "--resume")[3:])
    assert res.exit_code == 0, res.output
    keys = dsc.open(out).keys
    unfinished = sorted(str(slow_src / k) for i, k in enumerate(keys) if i // 6 not in kept)
    assert len(unfinished) == 240 - 15 * 6
    assert sorted(counter.names) == unfinished  # the kept units' images were not decoded again
    assert "resumed: 15 finished shards verified and kept" in res.output
    assert f"{len(unfinished)} decoded by this run" in res.output
    assert tree_bytes(out) == reference_tree


def test_resume_refuses_other_options(slow_src, tmp_path, monkeypatch):
    out = tmp_path / "out"
    _interrupted_compile(slow_src, out, monkeypatch, size=96, shard_size=6, workers=2)
    r = subprocess.run(compile_cmd(slow_src, out, "--resume", "--fill", "3"), env=ENV, capture_output=True, text=True)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert "was made with other options (fill=0 then, 3 now)" in r.stderr and "without --resume" in r.stderr
    assert "with --resume" not in r.stderr  # (no note saying to rerun with --resume: that cannot help)


def test_resume_refuses_changed_inputs_and_says_to_start_over(slow_src, tmp_path, monkeypatch):
    src = tmp_path / "src"
    shutil.copytree(slow_src, src)
    out = tmp_path / "out"
    _interrupted_compile(src, out, monkeypatch, size=96, shard_size=6, workers=2)
    next(src.glob("*/*.jpg")).unlink()
    r = subprocess.run(compile_cmd(src, out, "--resume"), env=ENV, capture_output=True, text=True)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert "the source's inputs changed since the partial compile" in r.stderr
    assert "rerun without --resume to start over" in r.stderr and "with --resume" not in r.stderr
    r = subprocess.run(compile_cmd(src, out), env=ENV, capture_output=True, text=True)  # the advice works
    assert r.returncode == 0, r.stderr


def test_second_compile_into_the_same_out_is_refused(slow_src, tmp_path):
    out = tmp_path / "out"
    slow = [*compile_cmd(slow_src, out)[:-7], "--size", "320", "--filter", "lanczos", "--shard-size", "4",
            "--workers", "1", "-q"]  # about two seconds of work
    first = subprocess.Popen(slow, env=ENV, stderr=subprocess.PIPE, text=True, start_new_session=True)
    while _units_done(out) < 1 and first.poll() is None:
        time.sleep(0.005)
    still_running = first.poll() is None
    if still_running:  # stopped (it keeps its lock) while the second runs: a slow second cannot outlast it
        os.killpg(first.pid, signal.SIGSTOP)
    try:
        second = subprocess.run(slow, env=ENV, capture_output=True, text=True, timeout=120)
    finally:
        if still_running:
            os.killpg(first.pid, signal.SIGCONT)
    assert first.wait(timeout=120) == 0, first.stderr.read()
    assert still_running, "the first compile finished before the second started; nothing was tested"
    assert second.returncode == 1 and "another dsc compile (pid " in second.stderr and ") is writing" in second.stderr
    assert "Traceback" not in second.stderr
    ref = tmp_path / "ref"
    subprocess.run([*slow[:5], str(slow_src), str(ref), *slow[7:]], env=ENV, check=True)
    assert tree_bytes(out) == tree_bytes(ref)  # the first is unharmed


def _limit_file_size(nbytes):
    def pre():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # write() then fails with EFBIG instead of killing us
        resource.setrlimit(resource.RLIMIT_FSIZE, (nbytes, nbytes))
    return pre


def test_file_size_limit_gives_a_clear_error(slow_src, tmp_path):
    out = tmp_path / "out"
    r = subprocess.run(compile_cmd(slow_src, out), env=ENV, capture_output=True, text=True,
                       preexec_fn=_limit_file_size(100_000))  # every shard is larger than this
    assert r.returncode == 1, r.stderr
    assert "Traceback" not in r.stderr and "File too large" in r.stderr and "--resume" in r.stderr
    assert not out.exists() and not (tmp_path / ".out.dsc-lock").exists()


@pytest.fixture
def tiny_disk(tmp_path):
    mnt = tmp_path / "disk"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here ({r.stderr.strip()}); the file-size-limit test covers EFBIG")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)])


def test_disk_full_gives_a_clear_error_and_a_resumable_partial(slow_src, reference_tree, tiny_disk):
    out = tiny_disk / "out"
    r = subprocess.run(compile_cmd(slow_src, out), env=ENV, capture_output=True, text=True)
    assert r.returncode == 1, r.stderr
    assert "Traceback" not in r.stderr and "No space left" in r.stderr and "--resume" in r.stderr
    assert not out.exists()
    from dsc.compiler.journal import Journal

    assert Journal.units_in(tiny_disk / ".out.dsc-tmp")
    subprocess.run(["mount", "-o", "remount,size=64m", str(tiny_disk)], check=True)  # space freed
    r = subprocess.run(compile_cmd(slow_src, out, "--resume"), env=ENV, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert tree_bytes(out) == reference_tree


# ----------------------------------------------------------------------------- bit flips
@pytest.fixture(scope="module")
def datasets(scenes_src, tmp_path_factory):
    from dsc.synthetic import detection_scenes, write_coco

    root = tmp_path_factory.mktemp("flip")
    dsc.compile_imagefolder(scenes_src, root / "fixed", size=(16, 20), shard_size=5, progress=False)
    dsc.compile_imagefolder(scenes_src, root / "ragged", max_side=24, shard_size=5, progress=False)
    ann, images = write_coco(root / "coco", detection_scenes(8, seed=2))
    dsc.compile_coco(ann, images, root / "det", size=48, resize="pad", shard_size=3, progress=False)
    return root


@pytest.mark.parametrize("name", ["fixed", "ragged", "det"])
def test_verify_detects_every_flipped_byte(datasets, tmp_path, name):
    src = datasets / name
    assert verify(src).ok
    m = dsc.open(src).manifest
    targets = [s.path for s in m.shards] + [f for f in m.files if "/c/" in f]  # shards and index arrays
    targets += [V.object_path(t["sha256"]) for t in m.shard_table.objects]  # and the shard table
    rng = np.random.default_rng(zlib.crc32(name.encode()))  # (hash() of a str changes from run to run)
    work = tmp_path / "d"
    shutil.copytree(src, work)
    for trial in range(40):
        rel = targets[trial % len(targets)]
        path = work / rel
        data = bytearray(path.read_bytes())
        pos = int(rng.integers(0, len(data)))
        old = data[pos]
        data[pos] ^= int(rng.integers(1, 256))
        path.write_bytes(bytes(data))
        report = verify(work)
        assert not report.ok, f"flip at {rel}:{pos} went unnoticed"
        assert any(p.file == rel for p in report.problems), (rel, [str(p) for p in report.problems])
        spec = next((s for s in m.shards if s.path == rel), None)
        if spec is not None:  # a shard: the damaged sample is named (or the Zarr index, past the samples)
            s = m.shards.index(spec)
            if m.image.layout == "fixed":
                per = m.image.sample_nbytes
                if pos < spec.count * per:
                    assert s * m.shard_size + pos // per in report.damaged_samples
                else:
                    assert any("shard index" in p.what for p in report.problems)
            else:
                assert report.damaged_samples and all(s * m.shard_size <= i < s * m.shard_size + spec.count
                                                      for i in report.damaged_samples)
        data[pos] = old
        path.write_bytes(bytes(data))
    assert verify(work).ok


def test_verify_cli_and_damaged_manifest(datasets, tmp_path):
    from click.testing import CliRunner

    from dsc.cli import main

    work = tmp_path / "d"
    shutil.copytree(datasets / "fixed", work)
    r = CliRunner().invoke(main, ["verify", str(work)])
    assert r.exit_code == 0 and r.output.startswith("OK:")
    shard = work / "image/c/1/0/0/0"
    data = bytearray(shard.read_bytes())
    data[16 * 20 * 3 * 2 + 7] ^= 0x40  # sample 2 of shard 1 = sample 7
    shard.write_bytes(bytes(data))
    r = CliRunner().invoke(main, ["verify", str(work)])
    assert r.exit_code == 1 and "image/c/1/0/0/0" in r.output and "samples 7" in r.output
    edit_manifest(work, lambda m: m["classes"].__setitem__(0, "tampered"), sealed=False)
    with pytest.raises(dsc.CorruptDatasetError, match="checksum"):
        dsc.open(work)
    edit_manifest(work, lambda m: m["files"].__setitem__("../../etc/passwd", {"nbytes": 1, "sha256": "0" * 64}),
                  sealed=False)
    with pytest.raises(dsc.UnsafePathError):
        dsc.open(work)


def test_resume_under_fail_refuses_shards_that_skipped_inputs(scenes_src, tmp_path, monkeypatch):
    src = tmp_path / "src"
    shutil.copytree(scenes_src, src)
    (src / "class_00" / "img_00001.jpg").write_bytes(b"")
    out = tmp_path / "out"
    # a skip run interrupted after journaling the unit that left the bad input out; then resume under fail
    _interrupted_compile(src, out, monkeypatch, size=16, shard_size=4, workers=1, on_error="skip")
    r = subprocess.run([sys.executable, "-m", "dsc.cli", "compile", "imagefolder", str(src), str(out), "--size", "16",
                        "--shard-size", "4", "--workers", "1", "--resume", "-q"], env=ENV, capture_output=True, text=True)
    assert r.returncode == 1 and "img_00001.jpg" in r.stderr and "--on-error skip" in r.stderr
    assert not out.exists()


def test_resume_refuses_another_table_column(scenes_src, tmp_path):
    """The resume fingerprint covers where pixels come from (here: which column of a table)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from dsc.compiler.journal import Journal, fingerprint, settings
    from dsc.compiler.options import CompileOptions
    from dsc.compiler.sources import get_source

    data = [f.read_bytes() for f in sorted(scenes_src.rglob("*.jpg"))]
    pq.write_table(pa.table({"a": data, "b": data[::-1], "label": [0] * len(data)}), tmp_path / "t.parquet")
    opts = CompileOptions(size=(8, 8), shard_size=4, workers=1, progress=False)
    table = lambda column: get_source("table")(path=tmp_path / "t.parquet", image_column=column)  # noqa: E731
    def print_of(column):
        scanned = table(column).scan()
        return fingerprint(scanned.records, settings(scanned, opts, 4, table(column)))

    Journal(tmp_path / ".out.dsc-tmp", print_of("a"), (), settings=settings(table("a").scan(), opts, 4,
                                                                             table("a"))).start()  # column a's plan
    with pytest.raises(dsc.DscError, match="other options .*source.image_column='a' then, 'b' now"):
        dsc.compile_table(tmp_path / "t.parquet", tmp_path / "out", image_column="b", size=(8, 8), shard_size=4,
                          workers=1, progress=False, resume=True)
    assert print_of("a") != print_of("b")


def test_a_worker_killed_mid_compile_is_an_error_not_a_hang(slow_src, reference_tree, tmp_path):
    """The out-of-memory killer takes one worker: the compile stops with a message naming it (instead of
    waiting forever for the lost shard, as multiprocessing.Pool would), and --resume finishes the job."""
    out = tmp_path / "out"
    p = subprocess.Popen(compile_cmd(slow_src, out), env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, start_new_session=True)
    t_end = time.monotonic() + 60
    while _units_done(out) < 3 and p.poll() is None and time.monotonic() < t_end:
        time.sleep(0.002)
    if p.poll() is None:
        os.kill(p.pid, signal.SIGSTOP)  # (so that it cannot finish between the look at its workers and the kill)
    children = (Path(f"/proc/{p.pid}/task/{p.pid}/children").read_text().split() if p.poll() is None else [])
    if not children:
        p.kill()
        pytest.skip("the compile finished before a worker could be killed")
    os.kill(int(children[0]), signal.SIGKILL)
    os.kill(p.pid, signal.SIGCONT)
    try:
        _, err = p.communicate(timeout=60)
    finally:  # a hung compile must not outlive the test
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)  # its own session: the compile and its workers
    assert p.returncode == 1 and "died (exit code -9" in err and "--resume" in err and "Traceback" not in err, err
    assert not out.exists()
    subprocess.run(compile_cmd(slow_src, out, "--resume"), check=True, env=ENV, capture_output=True, timeout=120)
    assert tree_bytes(out) == reference_tree


def test_fail_fast_stops_never_hang(scenes_src, tmp_path):
    """Stopping at a bad input kills the workers, maybe halfway through sending a result: repeated, in one
    process, the stop must come back every time (a multiprocessing.Pool hung here, holding a dead worker's lock)."""
    src = tmp_path / "src"
    shutil.copytree(scenes_src, src)
    (src / "class_00" / "a_broken.jpg").write_bytes(b"\xff\xd8 not a jpeg")
    code = ("import dsc\n"
            "for i in range(12):\n"
            "    try:\n"
            f"        dsc.compile_imagefolder({str(src)!r}, {str(tmp_path)!r} + f'/o{{i}}', size=16, shard_size=1,\n"
            "                                workers=2, progress=False)\n"
            "    except dsc.SampleError:\n"
            "        pass\n"
            "    else:\n"
            "        raise SystemExit('the bad input did not stop the compile')\n")
    subprocess.run([sys.executable, "-c", code], env=ENV, check=True, timeout=120)


def _echo_big(task: bytes) -> bytes:
    return task[::-1] * 2


def test_worker_pool_moves_big_tasks_and_results_without_deadlock():
    """Tasks and results larger than a pipe's buffer (a COCO shard's records and boxes at a big shard size)
    must not leave the parent and a worker each blocked sending to the other."""
    import threading

    from dsc.compiler.pool import WorkerPool

    tasks = [bytes([i]) * 300_000 for i in range(7)]
    pool = WorkerPool(2, _echo_big)
    got = []
    t = threading.Thread(target=lambda: got.extend(pool.imap_unordered(tasks)), daemon=True)
    t.start()
    t.join(60)
    pool.close()
    assert not t.is_alive(), "the worker pool deadlocked"
    assert sorted(got) == sorted(_echo_big(x) for x in tasks)


class _Finalized:
    """Cyclic garbage whose finalizer records the process that ran it."""

    def __init__(self, marker):
        self.marker, self.me = marker, self

    def __del__(self):
        with open(self.marker, "a") as f:
            f.write(f"{os.getpid()}\n")


def _full_collection(_):
    import gc

    gc.collect()
    return os.getpid()


def test_workers_never_finalize_the_parents_garbage(tmp_path):
    """Garbage the parent had not collected yet is not the workers' to finalize: a dropped dask Client's
    __del__ run in a worker waited 40 s for an event-loop thread that fork does not copy."""
    import gc

    from dsc.compiler.pool import WorkerPool

    marker = tmp_path / "finalized-in"
    gc.disable()
    try:
        _Finalized(marker)  # unreachable at once, freed only by the collector
        pool = WorkerPool(2, _full_collection)
    finally:
        gc.enable()
    try:
        workers = set(pool.imap_unordered([0, 1, 2, 3]))
    finally:
        pool.close()
    gc.collect()
    assert marker.read_text().split() == [str(os.getpid())] and str(os.getpid()) not in workers


def _dies_after_returning(t):
    import threading

    def once_sent():  # the worker's main thread is back waiting for a task: its result was sent
        main = threading.main_thread().ident
        while True:
            f, names = sys._current_frames().get(main), set()
            while f is not None:
                names.add(f.f_code.co_name)
                f = f.f_back
            if "recv" in names and "_dies_after_returning" not in names:
                os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(0.001)
    if t == 3:  # dies just after its result is sent, before it takes another task
        threading.Thread(target=once_sent, daemon=True).start()
    time.sleep(0.01)
    return t


def test_a_result_received_before_its_worker_died_is_kept():
    """The finished unit still reaches the caller (and the resume journal) before WorkerDied."""
    from dsc.compiler.pool import WorkerDied, WorkerPool

    pool = WorkerPool(2, _dies_after_returning)
    got = []
    try:
        with pytest.raises(WorkerDied, match="exit code -9"):
            for r in pool.imap_unordered(range(6)):
                got.append(r)
                time.sleep(0.2)  # a slow consumer: the worker dies while the parent holds its result
    finally:
        pool.close()
    assert 3 in got


def test_workers_end_with_their_parent_even_without_pdeathsig(tmp_path):
    """Workers hold no copy of the parent's pipe ends, so the parent's death closes their pipes and they
    exit; PR_SET_PDEATHSIG (Linux only) is not needed for that."""
    code = ("import os, time\n"
            "from dsc.compiler.pool import WorkerPool\n"
            "p = WorkerPool(2, abs)\n"
            "assert sorted(p.imap_unordered([-1, -2])) == [1, 2]\n"
            "print(' '.join(str(w.pid) for w, _ in p._workers), flush=True)\n"
            "time.sleep(60)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], env=ENV, stdout=subprocess.PIPE, text=True)
    try:
        pids = [int(x) for x in proc.stdout.readline().split()]
    finally:
        proc.kill()
        proc.wait()
    assert len(pids) == 2

    def alive(pid):
        try:
            return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
        except FileNotFoundError:
            return False
    t_end = time.monotonic() + 10
    while any(map(alive, pids)) and time.monotonic() < t_end:
        time.sleep(0.05)
    left = [pid for pid in pids if alive(pid)]
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert not left, "workers outlived their parent"
