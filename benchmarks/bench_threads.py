"""Where the Loader's second filler thread goes: for each workload, the Loader at 1 and at 2 threads beside the
three parallel controls (parallel_control: compute-bound, memory-bandwidth-bound, in-cache), measured in the same
minutes (controls before and after, averaged), with, per image: the process's CPU, the filler threads' own CPU,
their run-queue wait (runnable, no core: the machine's load), their blocked time (neither running nor runnable:
waiting for the GIL, a lock, the disk), the consumer thread's CPU, and the minor page faults a batch. A Loader
scaling worse than the controls with its blocked time up at 2 threads loses its second thread to the GIL; one
whose CPU per image rises at 2 threads while the stream control scales worse than the others is
bandwidth-bound. Read beside the load average (printed): on a shared machine wall ratios follow the CPU
share a run gets; the blocked time and the faults do not.

``python benchmarks/bench_threads.py [instances] [autoaugment] [ra] [augmix] [--rounds N]`` (all four without
names): ``instances`` is bench_instances' dataset (format="torchvision": per-object masks and keypoints, flips),
the others bench_presets' classification presets on the recipe benchmark's JPEGs (batch 128, dict form)."""
from __future__ import annotations

import os
import resource
import sys
import threading
import time

import parallel_control
from common import BENCH_DIR, pop_rounds

WORKLOADS = ("instances", "autoaugment", "ra", "augmix")
CLS_SAMPLES = 1024


def _sched() -> tuple[float, float]:
    """(CPU seconds, run-queue wait seconds) of the calling thread so far (Linux schedstat)."""
    with open("/proc/thread-self/schedstat") as f:
        cpu, wait, _ = f.read().split()
    return int(cpu) / 1e9, int(wait) / 1e9


class _Probe:
    """Wraps prefetch._make_batch: per filler thread, CPU, run-queue wait, wall and minor faults of its batches."""

    def __init__(self):
        from dsc.runtime import prefetch

        self.stats: dict[int, list[float]] = {}
        self.lock = threading.Lock()
        orig = self.orig = prefetch._make_batch

        def wrapped(state, j, stream):
            c0, w0 = _sched()
            t0, f0 = time.perf_counter(), resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
            try:
                return orig(state, j, stream)
            finally:
                c1, w1 = _sched()
                t1, f1 = time.perf_counter(), resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
                with self.lock:
                    s = self.stats.setdefault(threading.get_ident(), [0.0] * 5)
                    for i, v in enumerate((c1 - c0, w1 - w0, t1 - t0, f1 - f0, 1)):
                        s[i] += v
        prefetch._make_batch = wrapped

    def totals(self) -> list[float]:
        with self.lock:
            return [sum(s[i] for s in self.stats.values()) for i in range(5)]


def workload(name: str):
    """(dataset, transforms, batch size, format, samples)."""
    import dsc
    from dsc import transforms as T

    if name == "instances":
        import bench_instances

        out = BENCH_DIR / f"coco-instances-{bench_instances.N}.dsc"
        if not out.exists():
            raise SystemExit(f"{out} is not there: run benchmarks/bench_instances.py once first")
        ds = dsc.open(out)
        return ds, [T.RandomHorizontalFlip()], 16, "torchvision", len(ds)
    import bench_recipe
    from bench_presets import classification_ops

    out = BENCH_DIR / "recipe-fixed.dsc"  # (bench_presets' dataset: its JPEGs are made only where it is not there)
    ds = dsc.open(out) if out.exists() else bench_recipe.compiled(bench_recipe.sources(), "fixed", size=256)
    return ds, classification_ops(name), 128, "dict", CLS_SAMPLES


def loader_run(probe: _Probe, ds, ops, batch_size: int, fmt: str, samples: int, threads: int) -> dict:
    """One timed epoch (after one that grows the ring, as every bench here) at ``threads`` filler threads."""
    import dsc

    loader = dsc.Loader(ds, batch_size=batch_size, order="random", num_threads=threads, transforms=ops, format=fmt,
                        indices=range(min(samples, len(ds))))
    for _ in loader:
        pass
    del _  # (a batch held through the timed epoch makes its ring slot allocate afresh)
    probe.stats.clear()
    m0 = _sched()[0]
    c0, t0, n = time.process_time(), time.perf_counter(), 0
    for b in loader:
        n += len(b[0]) if isinstance(b, tuple) else len(b["image"])
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    main_cpu = _sched()[0] - m0
    fill_cpu, rq, fill_wall, faults, batches = probe.totals()
    loader.close()
    ms = 1e3 / n
    return {"rate": n / wall, "cpu": cpu * ms, "fill": fill_cpu * ms, "rq": rq * ms,
            "blocked": (fill_wall - fill_cpu - rq) * ms, "main": main_cpu * ms, "faults": faults / max(batches, 1),
            "cores": cpu / wall}


def _line(d: dict) -> str:
    return (f"{d['rate']:6.0f} img/s, CPU {d['cpu']:.3f} ms/img (fillers {d['fill']:.3f}, run-queue {d['rq']:.3f}, "
            f"blocked {d['blocked']:.3f}; consumer {d['main']:.3f}), {d['cores']:.2f} cores, "
            f"{d['faults']:.0f} faults/batch")


def main(argv=None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    rounds = pop_rounds(args)
    names = args or list(WORKLOADS)
    if not set(names) <= set(WORKLOADS):
        raise SystemExit(f"usage: python bench_threads.py [--rounds N] [{' | '.join(WORKLOADS)} ...]")
    probe = _Probe()
    print(f"Loader 1 vs 2 filler threads beside the parallel controls, same minutes (load "
          f"{os.getloadavg()[0]:.2f}; {os.cpu_count()} CPUs)")
    for name in names:
        w = workload(name)
        for _ in range(rounds):
            before = parallel_control.scalings()
            one = loader_run(probe, *w, threads=1)
            two = loader_run(probe, *w, threads=2)
            after = parallel_control.scalings()
            controls = ", ".join(f"{k} x{(before[k] + after[k]) / 2:.2f}" for k in before)
            print(f"{name} (load {os.getloadavg()[0]:.2f})\n  1 thread:  {_line(one)}\n  2 threads: {_line(two)}\n"
                  f"  2 threads / 1: x{two['rate'] / one['rate']:.2f} the rate, x{two['cpu'] / one['cpu']:.2f} the CPU "
                  f"an image; parallel controls {controls}", flush=True)


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    main()
