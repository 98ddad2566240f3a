"""A compile on a Dask cluster (``--executor tcp://scheduler:8786``, or a ``dask.distributed`` Client).

The workers need no filesystem shared with the client when the inputs and the output are in object storage:
each worker reads its unit's inputs from the bucket, writes the unit's shards in a temporary folder of its
own and uploads them straight to the output URL with create-only puts (units.py); the client journals each
unit's result, writes the small metadata and commits the version record (upload.py). It never reads an
image. A worker lost mid-unit is retried elsewhere by Dask: the unit's bytes are the same, so an upload the
lost worker finished is recognised as this writer's and kept.

Local inputs or a local output still work when every worker sees them at the same path; that is checked on
the workers before any unit runs, so a cluster that cannot see them gets one line saying so.

Units that share reads (a Parquet row group holds several units' rows: ``Source.shares_reads``) are not left to
Dask to place, which hands them out in order to whichever worker is free (each row group then read by every
worker). The client places them as the local pool does (``pool._Runs``): each worker runs a contiguous run of
units, a few at once (its threads, and one more to start while a unit uploads), each told the unit its worker
runs next (``then``: read ahead). A unit goes to its worker by a loose restriction, so a lost worker's unit is
still retried elsewhere (and Dask's work stealing may still move one). The runs are cut for the workers there
when the compile starts; with none yet (an adaptive cluster scaled to zero), Dask places the units.
"""
from __future__ import annotations

import os
from contextlib import contextmanager

from ..errors import SourceError
from .pool import _Runs

SEE_ALSO = ("put them on a filesystem every worker mounts at the same path, or in object storage "
            "(s3://, gs://, az://), which the workers read themselves")


@contextmanager
def connected(executor):
    """The Dask client of ``executor`` (a Client as it is, or a scheduler address: connected, closed after)."""
    try:
        from dask.distributed import Client
    except ImportError:
        raise SourceError("--executor needs dask.distributed: pip install 'dsc[dask]'") from None
    if isinstance(executor, Client):
        yield executor
        return
    try:
        client = Client(executor, timeout="20s")
    except (OSError, ValueError, TypeError) as e:
        raise SourceError(f"cannot reach the Dask scheduler at {executor!r}: {e}; give its address as "
                          f"tcp://host:8786") from None
    try:
        yield client
    finally:
        client.close()


def dask_map(executor):
    """``map(fn, items) -> list`` on the cluster's workers (a source's scan: a tar's index read where it lives)."""
    def run(fn, items):
        items = list(items)
        if not items:
            return []
        with connected(executor) as client:
            local = [i for i in items if isinstance(i, str) and "://" not in i]
            check_workers_see(client, local[:1] + local[-1:], None)
            futures = client.map(fn, items, pure=False)
            try:
                return client.gather(futures)
            finally:
                client.cancel(futures)
    return run


def _visible(paths):
    """On a worker: the first of ``paths`` that is not there (None when it sees them all)."""
    return next((p for p in paths if not os.path.exists(p)), None)


def check_workers_see(client, inputs: list[str], output: str | None) -> None:
    """Refuse, in one line, a cluster whose workers cannot see a local input (the first and last record's
    files) or the local folder the shards are written into (``output``)."""
    paths = [p for p in dict.fromkeys(inputs) if p] + ([output] if output else [])
    if not paths:
        return
    seen = client.run(_visible, paths)
    for worker, missing in sorted(seen.items()):
        if missing is None:
            continue
        if missing == output:
            raise SourceError(f"the Dask worker {worker} cannot see {output}, where this compile writes its shards: "
                              f"compile to a URL (s3://, gs://, az://), where each worker uploads its own shards, "
                              f"or to a folder every worker mounts at the same path")
        raise SourceError(f"the Dask worker {worker} cannot read {missing} (an input on the client's filesystem): a "
                          f"cluster compile reads its inputs on the workers; {SEE_ALSO}")


def results(executor, todo, run, inputs: list[str], output: str | None, runs: bool = False, then=None):
    """Run units on the cluster; yield their results as they finish. Closing the generator cancels what is
    left, while the client is still open (``with closing(...)``). ``runs`` and ``then``: as the pool's
    ``imap_unordered`` (units sharing reads go to one worker in contiguous runs; see the module docstring)."""
    with connected(executor) as client:
        check_workers_see(client, inputs, output)
        workers = sorted(client.nthreads().items()) if runs else []  # (address, threads) of each worker there now
        if workers:  # (none yet, as an adaptive cluster starts: Dask places the units)
            yield from _in_runs(client, workers, todo, run, then)
            return
        from dask.distributed import as_completed

        futures = client.map(run, list(todo), pure=False)
        try:
            for fut in as_completed(futures):
                yield fut.result()
        finally:
            _cancel(client, futures)


def _cancel(client, futures) -> None:
    try:
        client.cancel(list(futures))
    except Exception:  # noqa: BLE001 - a client already closing: nothing is left to cancel
        pass


def _in_runs(client, workers: list, tasks, run, then):
    """``run`` of each task, each of ``workers`` (address, threads) taking a contiguous run of them
    (``pool._Runs``), its threads + 1 at once; a task is submitted with ``then(task, the task its worker takes
    after it)`` when ``then`` is given."""
    from dask.distributed import as_completed

    todo = _Runs(tasks, len(workers))
    owner: dict = {}  # each future in flight: the worker (its index) whose run it came from
    done = as_completed()

    def submit(w: int) -> None:
        task = todo.peek(w)
        if task is None:
            return
        sent = task if then is None else then(task, todo.after(w))
        fut = client.submit(run, sent, workers=[workers[w][0]], allow_other_workers=True, pure=False)
        todo.take(w)
        owner[fut] = w
        done.add(fut)

    try:
        for w, (_, threads) in enumerate(workers):
            for _ in range(max(1, int(threads)) + 1):
                submit(w)
        for fut in done:
            w = owner.pop(fut)
            value = fut.result()
            submit(w)  # before the caller handles the result, as the pool does
            yield value
    finally:
        _cancel(client, owner)
