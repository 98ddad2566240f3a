"""The compile's worker processes: one pipe per worker, nothing shared between them.

``multiprocessing.Pool`` was not used because of how it fails. Its workers share one result queue
guarded by one lock: ``terminate()`` that kills a worker halfway through sending a result leaves the
lock held, and the pool's own shutdown then waits for it forever (seen here when a fail-fast compile
stopped). A worker that dies (the kernel's OOM killer, a segfault in a codec) leaves its task
unanswered, and ``imap_unordered`` waits for it forever. Here each worker has its own pipe, so killing
one breaks nothing shared, and the parent waits on the workers' exit sentinels as well as on their
pipes, so a dead worker becomes an error that names it.

A worker holds one task at a time: the parent sends the next one only after taking the worker's result.
(Queueing a second task while the worker runs can deadlock: a task too big for the pipe's buffer blocks
the parent's send until the worker reads it, while the worker is blocked sending a result too big for
the buffer, which the parent, stuck in its send, never reads.)
"""
from __future__ import annotations

from collections.abc import Sequence

import gc
import multiprocessing as mp
import os
import pickle
from multiprocessing.connection import wait

from ..errors import DscError


class WorkerDied(DscError, RuntimeError):
    pass


CAN_FORK = "fork" in mp.get_all_start_methods()


# What the fork server imports once for every fresh worker: the compile's modules, and the libraries a worker that
# reads or writes object storage imports on its first unit (obstore's Rust library and the CRC32C one each took about
# 0.05 s of CPU to load, in each worker of each compile; a missing one is left out)
PRELOAD = ["dsc.compiler.units", "obstore", "obstore.store", "google_crc32c"]


def _context(fresh: bool = False):
    # fork starts workers in milliseconds; the compile path never starts threads before the workers. A worker
    # that reads object storage is started ``fresh``: the object-store client cannot make requests in a process
    # forked from one that used it (its runtime's threads are not there). Fresh workers are forked from a fork
    # server that has imported the compile's modules and never used the client (started once per process), else
    # spawned.
    if CAN_FORK and not fresh:
        return mp.get_context("fork")
    if "forkserver" in mp.get_all_start_methods():
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload(PRELOAD)
        return ctx
    return mp.get_context("spawn")


def _serve(conn, fn, initializer, inherited=(), environ=None) -> None:
    # Objects inherited through fork are the parent's: never collect them here. Garbage the parent had not
    # collected yet would otherwise run its finalizers in the worker, where its threads do not exist (a
    # dropped dask Client's __del__ waited 40 s here for its event loop).
    gc.freeze()
    if environ is not None:  # forked from the fork server: its environment is the parent's as it was when the
        os.environ.clear()   # server started; the parent's now (credentials, an endpoint set since) is this one's
        os.environ.update(environ)
    for c in inherited:  # the parent's ends of the pipes (forked copies): with them closed here, a parent that
        c.close()        # dies closes every pipe, and recv() below ends the worker even without PR_SET_PDEATHSIG
    if initializer is not None:
        initializer()
    while True:
        try:
            task = conn.recv()
        except (EOFError, OSError):
            return
        if task is None:
            return
        try:
            reply = (True, fn(task))
        except Exception as e:  # noqa: BLE001  (sent to the parent, which raises it)
            try:
                pickle.loads(pickle.dumps(e))  # some exceptions pickle but cannot be rebuilt
            except Exception:  # noqa: BLE001
                e = RuntimeError(f"{type(e).__name__}: {e}")
            reply = (False, e)
        conn.send(reply)


def _start_without_main(p) -> None:
    """Start a spawned worker without running the caller's main script again in it (what spawn does by default,
    so that functions defined there can be unpickled): a script that calls ``dsc.compile_*`` at its top level,
    without an ``if __name__ == "__main__"`` guard, would otherwise compile again in every worker. Used only when
    nothing the workers run comes from ``__main__``."""
    from multiprocessing import spawn

    real = spawn.get_preparation_data

    def without_main(name):
        data = real(name)
        data.pop("init_main_from_path", None)
        data.pop("init_main_from_name", None)
        return data

    spawn.get_preparation_data = without_main
    try:
        p.start()
    finally:
        spawn.get_preparation_data = real


class _Queue:
    """Tasks in order, to whichever worker asks."""

    def __init__(self, tasks):
        self._it = iter(tasks)  # (taken as sent: a compile's tasks are made one at a time)
        self._next = next(self._it, None)

    def peek(self, w: int):
        return self._next

    def take(self, w: int) -> None:
        self._next = next(self._it, None)

    def after(self, w: int):
        return None


class _Runs:
    """Tasks in contiguous runs, one per worker (``n``), so that neighbouring tasks that share reads (the units
    of one Parquet row group, fetched once per process) go to the same worker: each worker starts at an evenly
    spaced place and takes the task after its last one; a worker whose run is done takes the far half of the
    longest run left (the last task of it, when one is left). Every task is taken once."""

    def __init__(self, tasks, n: int):
        self.tasks = tasks if isinstance(tasks, Sequence) else list(tasks)  # (indexed only: a lazy sequence stays one)
        k = len(self.tasks)
        self.runs = [[w * k // n, (w + 1) * k // n] for w in range(max(1, n))]  # [next, end) of each worker

    def peek(self, w: int):
        lo, hi = self.runs[w]
        if lo >= hi:
            v = max(range(len(self.runs)), key=lambda i: self.runs[i][1] - self.runs[i][0])
            vlo, vhi = self.runs[v]
            if vlo >= vhi:
                return None
            mid = (vlo + vhi + 1) // 2 if vhi - vlo > 1 else vlo
            self.runs[v], self.runs[w] = [vlo, mid], [mid, vhi]
        return self.tasks[self.runs[w][0]]

    def take(self, w: int) -> None:
        self.runs[w][0] += 1

    def after(self, w: int):
        """The task worker ``w`` takes after the one ``peek`` gave it, unless another's run ends first."""
        lo, hi = self.runs[w]
        return self.tasks[lo + 1] if lo + 1 < hi else None


class WorkerPool:
    """``WorkerPool(n, fn, initializer)``; ``imap_unordered(tasks)`` yields ``fn(task)`` as workers finish
    them (a task's exception is raised in the parent); ``close()`` stops and reaps every worker."""

    def __init__(self, processes: int, fn, initializer=None, fresh: bool = False):
        ctx = _context(fresh)
        self._workers = []
        try:
            for _ in range(processes):
                parent_end, child_end = ctx.Pipe()
                inherited = [c for _, c in self._workers] + [parent_end] if ctx.get_start_method() == "fork" else []
                environ = dict(os.environ) if ctx.get_start_method() == "forkserver" else None
                p = ctx.Process(target=_serve, args=(child_end, fn, initializer, inherited, environ), daemon=True,
                                name=f"dsc-compile-{len(self._workers)}")
                if ctx.get_start_method() == "fork" or b"__main__" in pickle.dumps((fn, initializer)):
                    p.start()
                else:
                    _start_without_main(p)
                child_end.close()
                self._workers.append((p, parent_end))
        except BaseException:
            self.close()
            raise

    def imap_unordered(self, tasks, runs: bool = False, then=None):
        """``runs``: neighbouring tasks share their reads (units of a Parquet row group): each worker takes the
        task after its last one (see :class:`_Runs`); else tasks go out in order. ``then(task, following)``: what
        is sent for ``task``, told the task the same worker will probably take after it (or None)."""
        todo = _Runs(tasks, len(self._workers)) if runs else _Queue(tasks)
        busy = set()  # the workers holding a task (one each)
        proc = {conn: p for p, conn in self._workers}
        by_sentinel = {p.sentinel: conn for p, conn in self._workers}

        order = {conn: w for w, (_, conn) in enumerate(self._workers)}

        def send_next(conn) -> None:
            task = todo.peek(order[conn])
            if task is not None:
                try:
                    conn.send(task if then is None else then(task, todo.after(order[conn])))
                except OSError:  # its end of the pipe is closed: the worker is gone
                    raise self._died(proc[conn]) from None
                todo.take(order[conn])
                busy.add(conn)

        for _, conn in self._workers:
            send_next(conn)
        while busy:
            for ready in wait([*busy, *(proc[c].sentinel for c in busy)]):
                conn = by_sentinel.get(ready, ready)
                if ready in by_sentinel and conn.poll():
                    continue  # dead, but its last result is still in the pipe: take that first
                try:
                    ok, value = conn.recv()
                except (EOFError, OSError):
                    raise self._died(proc[conn]) from None
                busy.discard(conn)
                if not ok:
                    raise value
                try:
                    send_next(conn)  # before the caller handles the result: the worker waits only for this
                except WorkerDied:
                    yield value  # finished before the worker died: the caller keeps (journals) it
                    raise
                yield value

    @staticmethod
    def _died(p) -> WorkerDied:
        p.join(5)
        how = {None: "still running", -9: "killed, often by the out-of-memory killer"}.get(p.exitcode, "")
        return WorkerDied(f"compile worker {p.name} died (exit code {p.exitcode}{': ' + how if how else ''}); the "
                          f"shards already written are kept: rerun with --resume")

    def close(self) -> None:
        """Stop every worker now (an unfinished task is abandoned) and reap them."""
        for p, conn in self._workers:
            if p.is_alive():
                p.kill()
            conn.close()
        for p, _ in self._workers:
            p.join()
        self._workers = []
