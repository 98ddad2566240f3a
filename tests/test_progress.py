"""dsc's progress bars: a forked child killed while it holds tqdm's process-shared write lock must not hang the
parent's next bar (the crash tests SIGKILL forked compiles; tqdm's default lock is a semaphore they share)."""
import os
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent("""
    import io, os, signal, time
    from tqdm import tqdm
    from dsc.progress import progress_bar

    lock = tqdm.get_lock()  # tqdm's default lock (a thread lock + a process-shared semaphore), made before the fork
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child takes the lock, says so, and waits to be killed
        lock.acquire()
        os.write(w, b"x")
        time.sleep(60)
        os._exit(0)
    assert os.read(r, 1) == b"x"
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    out = io.StringIO()
    with progress_bar(total=3, desc="t", file=out) as b:
        b.update(3)
    with progress_bar(total=1, disable=True) as b:  # (a disabled bar takes the lock too)
        b.update(1)
    print(out.getvalue())
""")


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_killed_child_holding_tqdms_lock_does_not_hang_the_next_bar():
    # in a process of its own: tqdm's default lock stays held by the dead child for the rest of that process
    try:
        p = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired:
        pytest.fail("a dsc progress bar waited for a write lock held by a dead child")
    assert p.returncode == 0, p.stderr
    assert "t: 3/3" in p.stdout
