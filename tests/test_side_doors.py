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
def test_a_vacuum_through_a_link_waits_for_an_update_of_the_real_path(tmp_path, monkeypatch):
    """`dsc vacuum alias` while an update of `real` is between writing its shards and committing: the vacuum is
    refused (one lock), and the version the update commits is whole."""
    src, real = _small(tmp_path)
    alias = tmp_path / "alias.dsc"
    alias.symlink_to(real)
    make_folder(src, 8, seed0=500)
    commit, seen = V.commit, []

    def vacuum_through_the_link_first(store, record):
        try:
            seen.append(dsc.vacuum(alias, older_than=0))
        except CompileLockedError as e:
            seen.append(e)
        return commit(store, record)
    monkeypatch.setattr(V, "commit", vacuum_through_the_link_first)
    r = dsc.compile_imagefolder(src, real, update=True, workers=1, **OPTS)
    assert r.committed and r.version == 1
    assert len(seen) == 1 and isinstance(seen[0], CompileLockedError), seen
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
