"""Compiling to object storage, and pushing a local dataset there (docs/REMOTE.md).

A compile to ``s3://bucket/prefix`` (or ``gs://``, ``az://``) compiles into a local staging dataset under
the cache directory (``CACHE/uploads/<id>/``) and uploads as it goes: each shard as soon as its unit is
written (in parallel; a shard by one conditional PUT), then the version's objects and the plain-Zarr view, then
the version record by one conditional put (If-None-Match: the commit), then the root ``zarr.json``. Until
the record is there, nothing in the bucket is a dataset to a reader (readers find versions by their
records). ``--resume`` continues an interrupted compile from its staging and skips every shard the bucket
already has with the same size and SHA-256 (each upload records the SHA-256 in the object's metadata).
"""
from __future__ import annotations

import hashlib
import mmap
import os
import shutil
import threading
from concurrent.futures import Future, ThreadPoolExecutor, wait
from contextlib import closing, contextmanager
from dataclasses import replace
from pathlib import Path

from ..errors import ConfigError, CorruptDatasetError, DscError, OutputExistsError, RemoteError, VersionConflictError
from ..progress import progress_bar
from ..formats import layout as L
from ..formats.layout import read_manifest
from ..formats import versions, view
from ..store.local import Root
from ..store import Store, default_cache_dir, open_store
from ..formats.remote import fetch_version, url_id
from .staging import is_dsc_dataset, staging_dir
from .options import CompileReport

CONNECTIONS = 8


class Uploader:
    """Uploads files of a local dataset in the background.

    Nothing is ever overwritten: every file is created by a conditional put (create-only), so writers at one
    URL cannot change each other's bytes, committed or not. A file that is there already is kept when it is
    provably this dataset's: a content-addressed object (its name is its SHA-256) whose bytes, read back, hash
    to its name (one damaged in the bucket is put again with the right bytes: the one overwrite, and a safe
    one, as its name allows no other bytes), or a
    shard with the same SHA-256 uploaded by this very writer (``writer``: a token kept in the writer's local
    staging, so a resumed upload has the same one; it travels in each shard's metadata). Anything else there
    (another writer's shard at that slot: one publishing now, or one that was interrupted) stops the upload
    with VersionConflictError, nothing committed. An update picks slots past every shard in the bucket
    (``free_slot``), so such leftovers never block the next writer; ``dsc vacuum`` removes them."""

    def __init__(self, store: Store, writer: str, connections: int = CONNECTIONS, fresh: bool = False,
                 unstage: bool = False):
        self.store = store
        self.writer = writer
        self.fresh = fresh  # a first compile (not resumed): its files are put without asking first (see submit)
        # a compile's: each shard it just wrote leaves the staging once the bucket has it (see settle)
        self.unstage = unstage
        self.pool = ThreadPoolExecutor(connections, thread_name_prefix="dsc-upload")
        self.jobs: dict[str, tuple[str, Future]] = {}
        self.lock = threading.Lock()
        self.sent = self.kept = self.bytes_sent = self.unstaged = 0
        self.new_jobs: list[Future] = []

    def submit(self, places: list[Path], rel: str, sha256: str, nbytes: int, new: bool = False) -> Future:
        """Upload ``rel`` (read from the first of ``places`` that has it), unless already done with this hash.
        A file re-written since its upload began (a compaction after skipped inputs) is uploaded again after
        the first upload ends, so the last bytes written are the ones the bucket keeps. ``new``: a shard this run
        just wrote (its SHA-256 computed from the bytes as they were written): it is not hashed again, and it
        is put without a request first to ask whether it is there (as every file of a ``fresh`` uploader);
        found there after all, it is checked as any other (``put_shard``)."""
        with self.lock:
            job = self.jobs.get(rel)
            if job is not None and job[0] == sha256:
                return job[1]
            fut = self.pool.submit(self._one, places, rel, sha256, nbytes, job[1] if job else None, new)
            self.jobs[rel] = (sha256, fut)
            if new:
                self.new_jobs.append(fut)
            return fut

    @property
    def url(self) -> str:
        return self.store.url

    def settle(self) -> None:
        """Wait for the uploads of the shards a compile just wrote (``new``), each of which, with ``unstage``, has
        then left the staging: the staging is flushed without them (a compile to a URL never writes its shards back
        to the local disk, nor keeps them there: the staging holds only the shards on their way up), and nothing
        removes a staged file after this (a compaction re-streams staged shards). A failed upload's error is
        raised where its future's result is asked for (the push), as before; its shard stays staged."""
        with self.lock:
            jobs, self.new_jobs = self.new_jobs, []
        wait(jobs)

    def _ours(self, rel: str, there: tuple[int, dict] | None, sha256: str, nbytes: int) -> bool:
        """Whether what is at ``rel`` is the file this writer would put there (see the class docstring)."""
        return is_ours(rel, there, sha256, nbytes, self.writer)

    def _one(self, places: list[Path], rel: str, sha256: str, nbytes: int, before: Future | None,
             new: bool = False) -> None:
        if before is not None:  # (submitted earlier, so already running or ahead in the queue)
            try:
                before.result()
            except Exception:  # noqa: BLE001 - superseded by this upload
                pass
        store = self.store
        fd = path = None
        for base in places:  # the staging directory is renamed into place when the compile ends
            path = base / rel
            try:
                fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
                break
            except FileNotFoundError:
                continue
        ask = not (new or self.fresh) or fd is None  # (not here: a worker uploaded it, or an earlier run did)
        try:
            there = store.stat(rel) if ask else _UNKNOWN
            keep = ask and self._ours(rel, there, sha256, nbytes) and intact(store, rel, sha256, nbytes)
        except BaseException:
            if fd is not None:
                os.close(fd)
            raise
        if keep:
            if fd is not None:
                os.close(fd)
            with self.lock:
                self.kept += 1
            return
        if fd is None:
            raise FileNotFoundError(f"{path}: not in the local staging, and not in the bucket")
        with os.fdopen(fd, "rb") as f, file_body(f) as body:
            # (new: hashed as it was written, moments ago, so its size says it is whole; else hashed here)
            wrong = len(body) != nbytes or (not new and hashlib.sha256(body).hexdigest() != sha256)
            if wrong:
                if rel.startswith(versions.OBJECTS + "/"):  # (a version's object: its shard table or a small file)
                    raise RemoteError(f"{path} ({rel}: an object of the version, e.g. its shard table) does not have "
                                      f"the bytes its name (SHA-256) says: the local dataset is damaged; run `dsc "
                                      f"verify` on it, and restore the file from an intact copy or recompile")
                raise RemoteError(f"{path} is not the file the dataset records ({nbytes:,} bytes, sha256 "
                                  f"{sha256[:16]}...): the local staging changed or is damaged (a crash, a power loss); run the compile again without "
                                  f"--resume")
            sent = put_shard(store, rel, body, sha256, nbytes, self.writer, there, ask=ask)
        gone = new and self.unstage and _unlink(path)  # (in the bucket: its pages are never written to disk)
        with self.lock:
            if sent:
                self.sent += 1
                self.bytes_sent += nbytes
            else:
                self.kept += 1
            self.unstaged += gone

    def _taken(self, rel: str) -> VersionConflictError:
        return taken(self.store, rel)

    def wait(self) -> None:
        for _, fut in list(self.jobs.values()):
            fut.result()

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)


def _unlink(path: Path) -> bool:
    try:
        os.unlink(path)
        return True
    except OSError:
        return False


@contextmanager
def file_body(f):
    """The bytes of the open binary file ``f`` as the buffer its PUT sends: a read-only map of its pages, so the
    upload reads them where they are (a ``read()`` copied every shard into a new buffer first). A staging file
    is written once and replaced only by a rename, never cut short in place (what would make a read of the map
    fault), and a PUT's request has taken its body when ``put`` returns. An empty file: ``b""``; a file that cannot
    be mapped (a filesystem without mmap): its bytes read."""
    if os.fstat(f.fileno()).st_size == 0:
        yield b""
        return
    try:
        body = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except (OSError, ValueError):
        yield f.read()
        return
    try:
        yield body
    finally:
        try:
            body.close()
        except BufferError:  # (a view of it still held somewhere: unmapped when that goes)
            pass


def is_ours(rel: str, there: tuple[int, dict] | None, sha256: str, nbytes: int, writer: str) -> bool:
    """Whether what is at ``rel`` (``there``: its stat) is the file ``writer`` would put there: a content-addressed
    object with those bytes, or a shard with this SHA-256 that this very writer uploaded (see :class:`Uploader`)."""
    if there is None or there[0] != nbytes:
        return False
    if rel.startswith(versions.OBJECTS + "/"):
        return rel.endswith("/" + sha256)
    return there[1].get("sha256") == sha256 and there[1].get("writer") == writer


def intact(store: Store, rel: str, sha256: str, nbytes: int) -> bool:
    """Whether the object at ``rel`` may be reused: a shard (its stat said whose it is: see :func:`is_ours`), or a
    content-addressed object whose bytes, read back (one GET of a small file), hash to its name. A name and a
    size say nothing of a byte rotted in the bucket: an update reusing it would commit a version damaged from
    birth."""
    if not rel.startswith(versions.OBJECTS + "/"):
        return True
    try:
        data = store.get_or_none(rel, nbytes)
    except CorruptDatasetError:  # (longer than its name's bytes: replaced since its stat)
        return False
    return data is not None and len(data) == nbytes and hashlib.sha256(data).hexdigest() == sha256


def replace_own(store: Store, rel: str, there: tuple[int, dict], writer: str) -> bool:
    """Remove a shard this writer uploaded with other bytes (a compaction after skipped inputs rewrote it), so
    that the new bytes can be created there; False (nothing removed) when it is not this writer's. A writer's
    shards are referenced by no version until its own commit, after its last upload, so nobody reads it."""
    if rel.startswith(versions.OBJECTS + "/") or there[1].get("writer") != writer:
        return False
    store.delete(rel)
    return True


_UNKNOWN = object()


def put_shard(store: Store, rel: str, f, sha256: str, nbytes: int, writer: str, there=_UNKNOWN,
              ask: bool = True) -> bool:
    """Upload one shard (``f``: its open file, already checked to hold ``sha256``) by a create-only put, with its
    hash and ``writer`` in its metadata; True when sent, False when this writer's copy was there already.
    Another writer's file there is a VersionConflictError (see :class:`Uploader`). ``there``: its stat, when the
    caller has it; else, with ``ask``, one request asks first (a resumed upload sends no shard the bucket has),
    and without it the put is made at once (a file just written: one request, not two) and what a refused
    create finds there is judged the same way."""
    attributes = {"sha256": sha256, "writer": writer}
    if there is _UNKNOWN:
        there = store.stat(rel) if ask else None
    if rel.startswith(versions.OBJECTS + "/"):  # content-addressed: reused only when its bytes hash to its name;
        if there is not None and is_ours(rel, there, sha256, nbytes, writer) and intact(store, rel, sha256, nbytes):
            return False
        # else (absent, damaged since it was written, or not asked) put by overwrite: these bytes, just hashed,
        # are the only ones its name allows, so no writer's or reader's object can change by it
        store.put(rel, f, attributes=attributes)
        return True
    if there is not None:
        if is_ours(rel, there, sha256, nbytes, writer):
            return False
        if not replace_own(store, rel, there, writer):
            raise taken(store, rel)
    try:
        store.put(rel, f, create_only=True, attributes=attributes)
    except FileExistsError:  # there after all: this writer's (a retried unit: the same bytes; a compaction's
        there = store.stat(rel)  # rewrite: other bytes, replaced), or another writer's
        if there is not None and is_ours(rel, there, sha256, nbytes, writer):
            return False
        if there is None or not replace_own(store, rel, there, writer):
            raise taken(store, rel) from None
        try:
            store.put(rel, f, create_only=True, attributes=attributes)
        except FileExistsError:
            raise taken(store, rel) from None
    return True


def taken(store: Store, rel: str) -> VersionConflictError:
    return VersionConflictError(
            f"{store.where(rel)} is another writer's (one publishing at {store.url} now, or one that was "
            f"interrupted): dsc never overwrites a file in object storage, and nothing of this run was committed. "
            f"Run it again: an update then writes past every file there (a first compile cannot: compile to "
            f"another URL, or remove the leftovers with `dsc vacuum {store.url}` once no writer runs)")


def push(local: str | os.PathLike, url: str, uploader: Uploader | None = None, progress: bool = True,
         what: str | None = None, force: bool = False) -> dict:
    """Upload the dataset at ``local`` (every version it keeps, its tags) to ``url``: shards and objects
    first, then each version record by a conditional put, oldest first, then the view. A record the bucket
    already has with the same bytes is kept (a push resumed); one with other bytes is another dataset's:
    :class:`~dsc.errors.VersionConflictError`. A tag the bucket has on a later version than this copy's is
    not moved back (an older copy pushed again would un-protect the version it names from vacuum):
    VersionConflictError before anything is uploaded, unless ``force``. Returns counts."""
    local = Path(local)
    root = Root(local)
    store = uploader.store if uploader is not None else open_store(url)
    if store.local:
        raise ConfigError(f"dsc push publishes to object storage (s3://, gs://, az://), got {url}; a local copy of a "
                          f"dataset is a copy of its folder")
    nums = versions.versions(root)
    if not nums:
        read_manifest(root)  # (not a dataset at all: that error first)
        raise ConfigError(f"{local} keeps no versions (compiled by a dsc before versions); recompile it to push it")
    if uploader is None:  # a push of a user's dataset (its writer token is kept in the cache, not beside it)
        key = hashlib.sha256(str(local.resolve()).encode()).hexdigest()[:16]
        with store.lock("push"), closing(Uploader(store, _token(default_cache_dir() / "uploads" / url_id(store.url)
                                                               / f"push-{key}"))) as own:
            return _push(local, root, nums, store, own, progress, what, force)
    return _push(local, root, nums, store, uploader, progress, what, force)


def _push(local: Path, root: Root, nums: list[int], store: Store, uploader: Uploader, progress: bool,
          what: str | None, force: bool = False) -> dict:
    """(See :func:`push`: the upload of ``nums``' files, by ``uploader``, then the commits, view, tags.)"""
    tags = _tags_to_push(root, store, force)
    records = {n: versions.read_record(root, n) for n in nums}
    remote = versions.versions(store)
    published = set()  # versions the bucket has already, with these bytes: their files are all there
    for n in set(nums) & set(remote):
        if store.get(versions.record_path(n)) != bytes(root.read(versions.record_path(n))):
            raise _conflict(store, n, what or str(local))
        published.add(n)
    done = {p for n in published for p in _paths(records[n]["manifest"])}
    jobs = {}
    for n, rec in records.items():
        if n in published:
            continue
        m = rec["manifest"]
        for spec in L.shard_specs(m):
            jobs[spec.path] = (spec.sha256, spec.nbytes)
        for rel, data in L.implied_files(m):  # (a ragged shard's own zarr.json, beside it)
            jobs[rel] = (hashlib.sha256(data).hexdigest(), len(data))
        for f in L.objects(m):  # (its small files' objects, and its shard table's)
            jobs[versions.object_path(f["sha256"])] = (f["sha256"], f["nbytes"])
    # (a published version's shards are there; its objects a new version reuses are checked like any other)
    jobs = {rel: job for rel, job in jobs.items() if rel not in done or rel.startswith(versions.OBJECTS + "/")}
    latest = records[nums[-1]]["manifest"]
    view_is_ours = not remote or nums[-1] >= remote[-1]  # (never turn the view back to an older version)
    futs = [uploader.submit([local], rel, sha, n) for rel, (sha, n) in jobs.items()]
    with progress_bar(total=len(futs), unit="file", desc="upload", disable=not progress) as bar:
        for f in futs:
            f.result()
            bar.update(1)
    for n in nums:  # the commits
        if n in published:
            continue
        data = bytes(root.read(versions.record_path(n)))
        try:
            store.put(versions.record_path(n), data, create_only=True)
        except FileExistsError:
            if store.get(versions.record_path(n)) != data:
                raise _conflict(store, n, what or str(local)) from None
    # After the commits, by the writer that made them: the view (copies of the latest version's objects, for
    # plain Zarr readers; dsc never reads it), the stat cache (advisory, for --update), the tags. A writer
    # that committed a newer version meanwhile writes its own view: this one leaves it alone.
    if view_is_ours and not view.superseded(store, latest):  # (formats/view.py: chunks, node metadata, the root)
        view.refresh(store, latest, None, src=versions.as_store(root))
        stat = local / versions.stat_path(nums[-1])
        if stat.is_file():
            store.put(versions.stat_path(nums[-1]), stat.read_bytes())
    for name in tags:
        store.put(f"{versions.TAGS}/{name}.json", bytes(root.read(f"{versions.TAGS}/{name}.json")))
    return {"versions": len(nums), "sent": uploader.sent, "kept": uploader.kept, "bytes_sent": uploader.bytes_sent}


def _tags_to_push(root: Root, store: Store, force: bool) -> list[str]:
    """The local tags a push writes: those the bucket lacks, or has on an earlier version. One the bucket has
    on a later version (or cannot read) is refused unless ``force``: a push never moves a tag back silently."""
    have, bad = versions.read_tags(store)
    out = []
    for name, n in sorted(versions.tag_names(root).items()):
        there = have.get(name)
        if there == n:
            continue
        if not force and (name in bad or (there is not None and there > n)):
            now = f"cannot be read ({bad[name]})" if name in bad else f"names version {there}"
            raise VersionConflictError(
                f"{store.url}: its tag {name!r} {now}, and this copy's names version {n}: dsc push does not move a "
                f"tag back (the version it names would lose the tag's protection from vacuum); nothing was "
                f"pushed. Pass --force (push(force=True)) to move it, or `dsc tag {store.url} {name} <N>` after "
                f"the push")
        out.append(name)
    return out


def _token(stage: Path) -> str:
    """This writer's token (see :class:`Uploader`), kept beside its staging folder ``stage`` (the file
    ``writer-<name>``) so that a resumed upload is the same writer; a new one when there is none."""
    import secrets

    where = Path(stage).parent / f"writer-{Path(stage).name}"
    try:
        token = where.read_text().strip()
        if token:
            return token
    except OSError:
        pass
    token = secrets.token_hex(12)
    where.parent.mkdir(parents=True, exist_ok=True)
    with open(where, "w") as f:  # (durable: a lost token makes the next --resume another writer of its own shards)
        f.write(token + "\n")
        f.flush()
        os.fsync(f.fileno())
    return token


def free_slot(store: Store, m) -> int:
    """The first shard slot past every shard file in the bucket (committed, or a writer's leftover)."""
    slots = [L.slot_of(rel) for folder in L.slot_folders(L.shard_nodes(m)) for rel, _ in store.list(folder + "/")]
    return max((s for s in slots if s is not None), default=-1) + 1


def _conflict(store: Store, n: int, what: str) -> VersionConflictError:
    return VersionConflictError(f"{store.where(versions.record_path(n))} is another dataset's version {n}, or "
                                f"another writer committed it meanwhile: nothing of {what} was committed. Publish "
                                f"to another URL, or run it again (an --update or a restore then applies on top)")


def _paths(m) -> set[str]:
    """Every file a version's record references: its shards and its objects."""
    return ({s.path for s in L.shard_specs(m)} | {rel for rel, _ in L.implied_files(m, listed=True)}
            | {versions.object_path(f["sha256"]) for f in L.objects(m)})


def pull_for_update(store: Store, dst: Path) -> int:
    """The latest version of the dataset at ``store`` as a local dataset without its shards or view: the
    record, its objects, the stat cache. An update runs on it (it never reads a base shard: rows it keeps are
    carried over by reference; nor the view, which it does not write there) and ``push`` then uploads only the
    new version's files. Returns N."""
    n = versions.versions(store)[-1]
    m = fetch_version(store, dst, n, tables=True)["manifest"]
    _pull_stat(store, dst, n, m)
    return n


def _pull_stat(store: Store, dst: Path, n: int, m) -> None:
    """Version ``n``'s stat cache (advisory: it lets the next --update skip re-reading unchanged inputs)."""
    stat = store.get_or_none(versions.stat_path(n), versions.stat_bytes(m.num_rows))
    if stat is not None:
        (dst / versions.STAT).mkdir(parents=True, exist_ok=True)
        (dst / versions.stat_path(n)).write_bytes(stat)


def _stage(store: Store, cache_dir, name: str | None) -> tuple[Path, Path]:
    """(the folder of ``store``'s local staging, a subfolder): ``CACHE/uploads/<id>/<name>`` (a compile's,
    found again by --resume), or with ``name=None`` a new empty folder of this run's own (an update or a
    restore: another one at the same URL on this machine stages beside it, never in it)."""
    import tempfile

    root = (Path(cache_dir) if cache_dir else default_cache_dir()) / "uploads" / url_id(store.url)
    _sweep(root)
    for attempt in range(3):
        root.mkdir(parents=True, exist_ok=True)
        try:
            (root / "url").write_text(store.url + "\n")
            return root, (root / name if name else Path(tempfile.mkdtemp(prefix="run-", dir=root)))
        except FileNotFoundError:  # another run's _unstage removed the emptied folder just now
            if attempt == 2:
                raise


GONE = ".gone-"  # a staging folder set aside to be removed (``_unstage(background=True)``)
_UNSTAGING: dict[Path, threading.Thread] = {}  # this process's removals of staging folders set aside, by folder
_UNSTAGING_LOCK = threading.Lock()  # (compiles to URLs may end in several threads of a process at once)


def _sweep(root: Path) -> None:
    """Remove the staging folders under ``root`` that a process set aside and did not remove (killed first): not
    this process's own, which its threads are removing."""
    try:
        entries = [e.name for e in os.scandir(root) if e.name.startswith(GONE)]
    except OSError:
        return
    for name in entries:
        with _UNSTAGING_LOCK:
            thread = _UNSTAGING.get(root / name)
        if thread is None or not thread.is_alive():
            shutil.rmtree(root / name, ignore_errors=True)


def _unstage(root: Path, stage: Path, background: bool = False) -> None:
    """Remove this run's staging ``stage``, then ``root`` if no other run's staging is left in it. ``background``:
    the folder is renamed aside at once (its name is free for the next run) and removed by a thread of this process
    (the interpreter waits for it at exit; ``unstaged()`` waits for it now), so the compile returns without waiting
    for it: the staging was flushed to disk when it was published, and on this ext4 each unlink of a flushed file
    waited for the journal (a second or more for the ~100 files and folders of a compile's staging, where the local
    compile has renamed its staging into place). A folder set aside by a process that was killed first is removed
    by the next run that stages under ``root``."""
    (root / f"writer-{stage.name}").unlink(missing_ok=True)  # (its writer token: see _token)
    if background:
        import secrets

        gone = root / f"{GONE}{stage.name}-{secrets.token_hex(4)}"
        try:
            os.rename(stage, gone)
        except OSError:  # (already gone, or cannot be renamed: removed here)
            pass
        else:
            thread = threading.Thread(target=_remove, args=(root, gone), name="dsc-unstage")
            with _UNSTAGING_LOCK:
                for done in [p for p, t in _UNSTAGING.items() if not t.is_alive()]:
                    del _UNSTAGING[done]
                _UNSTAGING[gone] = thread
                thread.start()
            return
    _remove(root, stage)


def _remove(root: Path, folder: Path) -> None:
    shutil.rmtree(folder, ignore_errors=True)
    try:
        if [e.name for e in os.scandir(root)] == ["url"]:
            (root / "url").unlink()
            os.rmdir(root)
    except OSError:  # (another run staged meanwhile: its folder stays, and _stage rewrote the url file)
        pass


def unstaged() -> None:
    """Wait until the staging folders this process set aside (``_unstage``) are removed."""
    with _UNSTAGING_LOCK:
        threads = list(_UNSTAGING.values())
    for thread in threads:
        thread.join()


@contextmanager
def _run_stage(store: Store, cache_dir):
    """A staging folder of this run's own (an update or a restore of ``store``), removed afterwards; an
    error naming it names the URL instead."""
    root, stage = _stage(store, cache_dir, None)
    try:
        yield stage
    except DscError as e:
        e.args = (str(e).replace(str(stage), store.url),)
        raise
    finally:
        _unstage(root, stage)


def update_url(update_local, url: str, options):
    """``--update`` of a dataset in object storage: its latest version pulled without shards into a local
    staging folder, updated there (``update_local(stage, name, first_slot, direct)``: only new and changed
    inputs decoded; ``name(message)`` puts the URL where a message names the staging folder), and
    pushed: the new shards and objects, then the new record by the conditional put (a concurrent update
    that committed first makes this one fail with VersionConflictError, nothing of it referenced). On a Dask
    cluster (``options.executor``) the units upload their own shards, as a compile's do (``direct``: the URL and
    this writer's token), so the workers need no filesystem shared with this one; the push then finds them in
    the bucket, this writer's, and sends only the small files."""
    store = open_store(url)
    with store.lock("update"), _run_stage(store, options.cache_dir) as stage:
        pull_for_update(store, stage)
        base = versions.read_record(stage, versions.versions(stage)[-1])["manifest"]
        first = free_slot(store, base)  # past every shard there: another writer's leftovers are never in the way
        direct = (store.url, _token(stage)) if options.executor is not None else None
        report = update_local(stage, lambda message: message.replace(str(stage), store.url), first, direct)
        sent = None
        if report.committed:  # (this writer's: under its lease, with a token that goes with its staging)
            with closing(Uploader(store, _token(stage))) as uploader:
                sent = push(stage, store.url, uploader, progress=options.progress, what="this update")
    return replace(report, path=store.url, uploaded=sent)


def compile_to_url(compile_local, url: str, options):
    """Compile (``compile_local(stage, options, on_unit, direct)``) into a local staging dataset while uploading its
    shards, then publish it at ``url`` (see the module docstring). Returns the compile report. On a Dask cluster
    (``options.executor``) the units upload their own shards (``direct``: the URL and this writer's token) and
    the staging gets everything else."""
    if options.overwrite:
        raise ConfigError(f"{url}: --overwrite of a dataset in object storage is not supported; compile to a new "
                          f"URL (versions in object storage are never overwritten)")
    store = open_store(url)
    existing = versions.versions(store)
    stage_root, stage = _stage(store, options.cache_dir, "dataset")
    staged = is_dsc_dataset(stage)
    if existing and not (options.resume and staged):
        raise OutputExistsError(f"{store.url} already holds a dsc dataset (versions {versions._ranges(existing)}); "
                                f"pass --update to make a new version of it, or compile to another URL")
    # On a cluster the units upload their own shards (``direct``: the workers need no filesystem shared with this
    # one); else this process uploads the shards it stages (``uploaded``), each leaving the staging once in the bucket.
    on_cluster = options.executor is not None
    # (a compile not resumed puts its files without asking the bucket first: see Uploader.submit)
    with store.lock("compile"), closing(Uploader(store, _token(stage), fresh=not options.resume,
                                                 unstage=not on_cluster)) as uploader:
        if options.resume and staged:
            report = None  # compiled already; the upload was interrupted
        else:
            if staged:
                shutil.rmtree(stage)  # a finished compile of an earlier run that was not resumed
            tmp = staging_dir(stage)

            def on_unit(res):
                for p in res.parts.values():
                    spec = getattr(p, "shard", None)
                    if spec is not None:
                        uploader.submit([tmp, stage], spec.path, spec.sha256, spec.nbytes, new=True)

            report = compile_local(stage, replace(options, overwrite=False), on_unit,
                                   (store.url, uploader.writer) if on_cluster else None,
                                   uploaded=None if on_cluster else uploader)
        sent = push(stage, store.url, uploader, progress=options.progress, what="this compile")
    if report is None:
        manifest = versions.read_record(Root(stage), versions.versions(Root(stage))[-1])["manifest"]
        report = CompileReport(path=stage, manifest=manifest, skipped=manifest.skipped, warnings=(), seconds=0.0,
                               bytes_written=0, resumed_units=0)
    _unstage(stage_root, stage, background=True)  # (published: the staging is removed while the caller goes on)
    return replace(report, path=store.url, uploaded=sent)
