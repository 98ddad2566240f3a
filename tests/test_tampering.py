"""What is planted beside or inside a dataset, and what is damaged in its metadata: dsc writes through no link,
refuses what it did not make with one line naming the path (and leaves no lock behind), and a damaged pin,
tag or record is a one-line error naming the file and the fix; a damaged tag breaks only itself."""
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

import dsc
from dsc.cli import main


def _folder(root: Path, seeds) -> None:
    for s in seeds:
        p = root / f"c{s % 3}" / f"s{s}.png"
        p.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(np.random.default_rng(s).integers(0, 256, (8, 8, 3), dtype=np.uint8)).save(p)


@pytest.fixture
def two_versions(tmp_path):
    """(source, OUT with versions 0 and 1, a victim folder outside it holding a file)."""
    src, out = tmp_path / "src", tmp_path / "out"
    _folder(src, range(20))
    dsc.compile_imagefolder(src, out, size=8, shard_size=8, workers=1, progress=False)
    _folder(src, range(20, 26))
    dsc.compile_imagefolder(src, out, size=8, shard_size=8, workers=1, progress=False, update=True)
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "precious").write_text("keep me")
    return src, out, victim


@pytest.fixture(autouse=True)
def _confirmed_at_a_terminal():
    """`--overwrite` of a dataset with two versions asks at a terminal (tests/test_side_doors.py): here, where
    what is tested is what comes after, it is asked and answered yes. (A patch of its own: a test's
    monkeypatch.undo() leaves it.)"""
    import dsc.cli

    with pytest.MonkeyPatch.context() as m:
        m.setattr(dsc.cli, "_at_a_terminal", lambda: True)
        yield


def cli(*args):
    r = CliRunner().invoke(main, [str(a) for a in args], input="y\n")
    assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)
    return r


def one_line_error(r, *words):
    """A refusal: exit code 1, one line "Error: ..." holding every word, no traceback."""
    lines = [line for line in r.output.splitlines() if line.startswith("Error:")]
    assert r.exit_code == 1 and len(lines) == 1 and "Traceback" not in r.output, r.output
    for w in words:
        assert w in lines[0], (w, lines[0])
    return lines[0]


def no_lock_left(out: Path) -> None:
    """No writer holds OUT's lock, and a refused run left no lock file."""
    lock = out.parent / f".{out.name}.dsc-lock"
    assert lock.is_symlink() or not lock.exists(), f"{lock} was left behind"  # (a link: the one the test planted)


def _writers(src, out):
    """Every command that writes OUT (and so takes its lock)."""
    return {"tag": ("tag", out, "t"), "update": ("compile", "imagefolder", src, out, "--update"),
            "overwrite": ("compile", "imagefolder", src, out, "--size", "8", "--overwrite"),
            "vacuum": ("vacuum", out, "--keep", "1", "--older-than", "0"),
            "restore": ("restore", out, "--version", "0"), "repair": ("verify", out, "--repair-view")}


# ----------------------------------------------------------------------------- planted links
@pytest.mark.parametrize("what", ["tag", "update", "overwrite", "vacuum", "restore", "repair"])
def test_a_link_at_the_lock_path_is_refused_and_its_target_untouched(two_versions, what):
    src, out, victim = two_versions
    target = victim / "precious"
    lock = out.parent / f".{out.name}.dsc-lock"
    lock.symlink_to(target)
    one_line_error(cli(*_writers(src, out)[what]), str(lock), "symbolic link", "Remove it")
    assert target.read_text() == "keep me" and lock.is_symlink()  # neither truncated nor removed
    lock.unlink()
    os.link(target, lock)  # a hard link to someone's file: not a lock file either
    one_line_error(cli(*_writers(src, out)[what]), str(lock), "2 names")
    assert target.read_text() == "keep me"
    lock.unlink()
    assert cli(*_writers(src, out)[what]).exit_code == 0
    no_lock_left(out)


@pytest.mark.parametrize("resume", [False, True])
def test_a_link_at_the_staging_path_is_refused_without_a_stale_lock(two_versions, resume):
    src, out, victim = two_versions
    staging = out.parent / f".{out.name}.dsc-tmp"
    staging.symlink_to(victim)
    cmd = ("compile", "imagefolder", src, out, "--size", "8", "--overwrite", *(("--resume",) if resume else ()))
    r = cli(*cmd)
    one_line_error(r, str(staging), "symbolic link", "Remove it")
    assert "--resume" not in r.output  # no advice to resume what cannot be resumed
    assert sorted(p.name for p in victim.iterdir()) == ["precious"]
    no_lock_left(out)
    assert not (out.parent / f".{out.name}.dsc-lock").exists()
    staging.unlink()
    assert cli(*cmd).exit_code == 0 and dsc.verify(out).ok


def test_links_inside_a_staging_folder_to_resume_are_refused(two_versions, monkeypatch):
    src, out, victim = two_versions
    from dsc.compiler import staging as S

    def stop(*a, **kw):
        raise KeyboardInterrupt("killed")
    monkeypatch.setattr(S.Staging, "publish", stop)
    with pytest.raises(KeyboardInterrupt), pytest.warns(UserWarning, match=r"--overwrite replaces .*versions 0-1"):
        dsc.compile_imagefolder(src, out, size=8, shard_size=8, workers=1, progress=False, overwrite=True)
    monkeypatch.undo()
    journal = out.parent / f".{out.name}.dsc-tmp" / ".journal"
    (journal / "plan.json").unlink()
    (journal / "plan.json").symlink_to(victim / "precious")
    cmd = ("compile", "imagefolder", src, out, "--size", "8", "--shard-size", "8", "--overwrite", "--resume")
    one_line_error(cli(*cmd), "plan.json", "symbolic link", "without --resume")
    assert (victim / "precious").read_text() == "keep me"
    no_lock_left(out)
    assert cli(*cmd[:-1]).exit_code == 0 and (victim / "precious").read_text() == "keep me"


def _plant(out: Path, rel: str, victim: Path) -> Path:
    p = out / rel
    if p.is_dir() and not p.is_symlink():
        shutil.rmtree(p)
    elif os.path.lexists(p):
        p.unlink()
    p.parent.mkdir(parents=True, exist_ok=True)
    p.symlink_to(victim)
    return p


@pytest.mark.parametrize("rel, cmd", [
    ("_dsc/txn/2", "update"),  # an interrupted update's folder
    ("image/c/4", "update"),  # the next shard slot
    ("label", "update"),  # a folder of the plain-Zarr view
    ("label", "restore"),
    ("transform", "repair"),
    ("_dsc/pins/0", "vacuum"),
    ("_dsc/objects", "update"),  # every object folder the dataset does not have yet
])
def test_links_inside_a_dataset_are_never_written_through(two_versions, rel, cmd):
    src, out, victim = two_versions
    _folder(src, range(100, 110))  # (an update has shards and objects to write)
    if rel == "_dsc/objects":
        links = [_plant(out, f"{rel}/{h:02x}", victim) for h in range(256) if not (out / rel / f"{h:02x}").exists()]
    else:
        links = [_plant(out, rel, victim)]
    before = {p.name: p.read_bytes() for p in victim.iterdir()}
    line = one_line_error(cli(*_writers(src, out)[cmd]), "symbolic link")
    assert any(str(p) in line for p in links), line
    assert {p.name: p.read_bytes() for p in victim.iterdir()} == before
    assert [e["version"] for e in dsc.log(out)] == [0, 1]  # refused before anything was committed or removed
    no_lock_left(out)
    for p in links:
        p.unlink()
    assert cli(*_writers(src, out)[cmd]).exit_code == 0
    assert cli("verify", out).exit_code == 0


def test_a_link_at_a_temporary_name_is_replaced_never_followed(two_versions):
    """dsc writes every file under a private name first (created O_EXCL | O_NOFOLLOW): a link planted at that
    name is removed, not written through."""
    src, out, victim = two_versions
    _folder(src, range(100, 104))
    traps = [out / "label" / ".zarr.json.tmp", out / "_dsc" / "stat" / ".2.bin.tmp", out / ".zarr.json.tmp"]
    for p in traps:
        p.symlink_to(victim / "precious")
    assert cli(*_writers(src, out)["update"]).exit_code == 0
    assert (victim / "precious").read_text() == "keep me" and dsc.verify(out).ok
    assert not any(os.path.lexists(p) for p in traps)  # each trap was at a name dsc wrote: replaced, then renamed


# ----------------------------------------------------------------------------- damaged metadata
def _tag_file(out, name, data):
    p = out / "_dsc" / "tags" / f"{name}.json"
    p.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(data, bytes):
        p.write_bytes(data)
    elif data == "dir":
        p.mkdir()
    elif data == "link":
        p.symlink_to(out / "zarr.json")
    return p


@pytest.mark.parametrize("damage", [b"\x00garbage", b"", b'{"version": "1"}', b'{"version": -1}', b'{"version": true}',
                                    b"[1]", "dir", "link"])
def test_a_damaged_tag_breaks_only_itself(two_versions, damage):
    src, out, _ = two_versions
    cli("tag", out, "good", "--version", "0")
    bad = _tag_file(out, "bad", damage)
    # everything else works; the commands that show tags warn about it
    r = cli("log", out)
    assert r.exit_code == 0 and "version 0 [good]" in r.output and "bad.json" in r.output and "--delete" in r.output
    assert cli("info", out).exit_code == 0
    assert len(dsc.open(out, tag="good")) == 20 and dsc.open(out).version == 1
    assert cli("tag", out, "other").exit_code == 0
    # what needs the bad tag names its file and the fix
    with pytest.raises(dsc.CorruptDatasetError, match="bad.json.*dsc tag .* bad --delete"):
        dsc.open(out, tag="bad")
    one_line_error(cli("vacuum", out, "--keep", "1", "--older-than", "0"), "bad.json", "--delete",
                   "nothing was removed")
    one_line_error(cli("tag", out, "bad"), "bad.json", "--delete", "does not replace")  # never silently replaced
    r = cli("verify", out)
    assert r.exit_code == 1 and "tag 'bad'" in r.output and "bad.json" in r.output and "is intact" in r.output
    assert dsc.verify(out, version=0).problems[0].tag
    # and --delete removes it, whatever it is
    r = cli("tag", out, "bad", "--delete")
    assert r.exit_code == 0 and "removed tag 'bad'" in r.output and not os.path.lexists(bad)
    assert cli("verify", out).exit_code == 0 and (out / "zarr.json").is_file()
    assert cli("vacuum", out, "--keep", "1", "--older-than", "0").exit_code == 0
    assert dsc.open(out, tag="good").version == 0  # the tagged version was kept


def test_a_tag_naming_a_missing_version(two_versions):
    _, out, _ = two_versions
    _tag_file(out, "gone", b'{"version": 9, "created": "2026-01-01T00:00:00Z"}')
    with pytest.raises(dsc.VersionNotFoundError, match="no version 9"):
        dsc.open(out, tag="gone")
    r = cli("verify", out)
    assert r.exit_code == 1 and "names version 9" in r.output and "--delete" in r.output


@pytest.mark.parametrize("damage", ["pin folder", "pins file", "pin link", "pin fifo"])
def test_damaged_pins_are_named(two_versions, damage):
    _, out, victim = two_versions
    pins = out / "_dsc" / "pins"
    shutil.rmtree(pins, ignore_errors=True)
    pins.mkdir()
    if damage == "pin folder":
        (pins / "1").mkdir()
        where = pins / "1"
    elif damage == "pins file":
        pins.rmdir()
        pins.write_text("")
        where = pins
    elif damage == "pin link":
        (pins / "1").symlink_to(victim / "precious")
        where = pins / "1"
    else:
        os.mkfifo(pins / "1")
        where = pins / "1"
    with pytest.raises(dsc.CorruptDatasetError, match=f"{where}.*Remove it"):
        dsc.open(out, version=1)
    one_line_error(cli("verify", out), str(where), "Remove it")
    vacuum = cli("vacuum", out, "--keep", "1", "--older-than", "0")  # (it locks version 0's pin, not 1's)
    if damage == "pins file":
        one_line_error(vacuum, str(where))
    else:
        assert vacuum.exit_code == 0 and os.path.lexists(where)  # (left as it is)
    assert (victim / "precious").read_text() == "keep me"
    if where.is_dir() and not where.is_symlink():
        where.rmdir()
    else:
        where.unlink()
    assert len(dsc.open(out, version=1)) == 26 and cli("verify", out).exit_code == 0


def _edit_record(out, n, edit):
    p = out / "_dsc" / "log" / f"{n}.json"
    rec = json.loads(p.read_text())
    edit(rec)
    p.write_text(json.dumps(rec))


@pytest.mark.parametrize("damage", ["manifest parent", "record parent", "number", "garbage", "manifest type"])
def test_a_damaged_record_names_its_file_and_the_fix(two_versions, damage):
    from tests.damage import seal

    _, out, _ = two_versions
    record = out / "_dsc" / "log" / "1.json"
    if damage == "manifest parent":  # the manifest's own version says parent 7 (sealed: its checksum matches)
        def edit(rec):
            rec["manifest"]["version"]["parent"] = 7
            seal(rec["manifest"])
        _edit_record(out, 1, edit)
    elif damage == "record parent":
        _edit_record(out, 1, lambda rec: rec.update(parent=0 if rec["parent"] is None else None))
    elif damage == "number":
        _edit_record(out, 1, lambda rec: rec.update(version=2))
    elif damage == "garbage":
        record.write_bytes(b"\xff\xfe not json")
    else:
        _edit_record(out, 1, lambda rec: rec["manifest"].update(num_samples="many"))
    with pytest.raises(dsc.CorruptDatasetError, match=f"{record}.*(put the right file back|move it out)"):
        dsc.open(out)
    for cmd in (("log", out), ("info", out), ("verify", out), ("restore", out, "--version", "0")):
        line = one_line_error(cli(*cmd), str(record))
        if damage != "garbage":
            assert "move it out of _dsc/log" in line, line
    assert len(dsc.open(out, version=0)) == 20  # the other versions still open
