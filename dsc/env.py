"""What dsc runs on: which PIL build (Pillow or pillow-simd), which JPEG library, which versions; the memory limit of
the process's cgroup (a container's), which both the runtime (``runtime.reads.available_memory``) and the compiler (a
WebDataset scan's ``keep_budget``) stay below. Imports nothing of dsc but its version."""
from __future__ import annotations

import platform
from pathlib import Path

from ._version import __version__


def _dist_version(name: str) -> str | None:
    import importlib.metadata as md  # (here: importing it costs ~25 ms, which a compile's workers need not pay)

    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return None


def pil_build() -> dict:
    """Which distribution provides ``PIL`` and with which codecs. Does not import torch."""
    import PIL
    from PIL import features

    simd = _dist_version("pillow-simd")  # importlib.metadata normalises the name (Pillow-SIMD too)
    return {
        "pil_distribution": "pillow-simd" if simd else "Pillow",
        "pil_version": PIL.__version__,
        "libjpeg_turbo": features.version("libjpeg_turbo") if features.check_feature("libjpeg_turbo") else None,
        "jpeg": features.version_codec("jpg"),
        "zlib": features.version_codec("zlib"),
        "webp": features.version_module("webp") if features.check_module("webp") else None,
    }


def environment(with_torch: bool = True) -> dict:
    import numpy

    env = {"dsc": __version__, "python": platform.python_version(), "platform": platform.platform(),
           "numpy": numpy.__version__, "zarr": _dist_version("zarr"), **pil_build()}
    if with_torch:
        import torch

        env["torch"] = torch.__version__
        env["cuda_available"] = torch.cuda.is_available()
        env["torch_threads"] = torch.get_num_threads()
        cpu = getattr(torch.backends, "cpu", None)  # the kernels of --resizer torch: AVX2, AVX512 or DEFAULT
        env["torch_cpu_capability"] = cpu.get_cpu_capability() if cpu is not None else None
    return env


# ----------------------------------------------------------------------------- memory (cgroups)
def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    if text == "max":
        return None
    try:
        return int(text)
    except ValueError:
        return None


def key_values(path: Path) -> dict[str, int]:
    """A ``key value`` file (memory.stat, /proc/meminfo) as a dict; empty when it cannot be read."""
    out = {}
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        parts = line.split()
        if len(parts) >= 2 and parts[1].isdigit():
            out[parts[0]] = int(parts[1])
    return out


def _mounts(text: str | None = None) -> dict[str, tuple[str, Path]]:
    """{"v2" | "v1": (root, mount point)} of the cgroup file systems this process sees (/proc/self/mountinfo:
    the root is the cgroup that appears at the mount point, "/" unless the mount shows a sub-tree, as in a
    container)."""
    out: dict[str, tuple[str, Path]] = {}
    try:
        lines = (Path("/proc/self/mountinfo").read_text() if text is None else text).splitlines()
    except OSError:
        return out
    for line in lines:
        left, sep, right = line.partition(" - ")
        f, r = left.split(), right.split()
        if not sep or len(f) < 5 or len(r) < 3:
            continue
        if r[0] == "cgroup2":
            out.setdefault("v2", (f[3], Path(f[4])))
        elif r[0] == "cgroup" and "memory" in r[2].split(","):
            out.setdefault("v1", (f[3], Path(f[4])))
    return out


def _cgroup_dir(kind: str, path: str, mounts: dict) -> Path:
    """Where cgroup ``path`` (from /proc/self/cgroup) is, under its mount (falling back to the usual one)."""
    root, point = mounts.get(kind, ("/", Path("/sys/fs/cgroup/memory" if kind == "v1" else "/sys/fs/cgroup")))
    root, path = root.rstrip("/"), path.rstrip("/")
    if path == root or path.startswith(root + "/"):
        return point / path[len(root):].lstrip("/")
    return point  # the path lies outside what is mounted: the mount shows this process's own cgroup


def cgroup_limit(cgroups: str | None = None, mounts: dict | None = None) -> tuple[int, int, str] | None:
    """(limit, bytes in use that cannot be reclaimed, where) of this process's memory cgroup, if it has a
    limit below the machine's memory: cgroup v2 ``memory.max`` (the lowest along the path), or v1
    ``memory.limit_in_bytes`` (its hierarchical limit). ``cgroups`` / ``mounts``: /proc/self/cgroup's text and
    :func:`_mounts`'s answer, read here when not given."""
    try:
        lines = (Path("/proc/self/cgroup").read_text() if cgroups is None else cgroups).splitlines()
    except OSError:
        return None
    mounts = _mounts() if mounts is None else mounts
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if controllers == "":  # cgroup v2: the lowest memory.max from this group up to the mount's top
            d = top = _cgroup_dir("v2", path, mounts)
            base = mounts.get("v2", ("/", Path("/sys/fs/cgroup")))[1]
            best = None
            while True:
                lim = _read_int(d / "memory.max")
                if lim is not None:
                    best = lim if best is None else min(best, lim)
                if d == base or base not in d.parents:
                    break
                d = d.parent
            if best is not None:
                cur = _read_int(top / "memory.current") or 0
                file = key_values(top / "memory.stat").get("file", 0)
                return best, max(0, cur - file), "cgroup memory.max"
        elif "memory" in controllers.split(","):  # cgroup v1
            d = _cgroup_dir("v1", path, mounts)
            stats = key_values(d / "memory.stat")
            lim = stats.get("hierarchical_memory_limit") or _read_int(d / "memory.limit_in_bytes")
            if lim is not None and lim < (1 << 60):
                use = _read_int(d / "memory.usage_in_bytes") or 0  # (hierarchical: so is total_cache)
                cache = stats.get("total_cache", stats.get("cache", 0))
                return lim, max(0, use - cache), "cgroup memory.limit_in_bytes"
    return None
