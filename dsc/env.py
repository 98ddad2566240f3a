"""What dsc runs on: which PIL build (Pillow or pillow-simd), which JPEG library, which versions."""
from __future__ import annotations

import importlib.metadata as md
import platform

from ._version import __version__


def _dist_version(name: str) -> str | None:
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
