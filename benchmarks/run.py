"""``make bench``: every benchmark, each printing rates beside a baseline measured in the same run."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import bench_compile  # noqa: E402
import bench_compile_read  # noqa: E402
import bench_detection  # noqa: E402
import bench_fields  # noqa: E402
import bench_instances  # noqa: E402
import bench_loader  # noqa: E402
import bench_mixture  # noqa: E402
import bench_overram  # noqa: E402
import bench_ranged  # noqa: E402
import bench_presets  # noqa: E402
import bench_recipe  # noqa: E402
import bench_remote  # noqa: E402
import bench_scale  # noqa: E402
import bench_versions  # noqa: E402
import bench_webdataset  # noqa: E402

if __name__ == "__main__":
    bench_compile_read.main()
    bench_compile.main()
    bench_detection.main()
    bench_fields.main()
    bench_instances.main()
    bench_loader.main()
    bench_mixture.main()
    bench_overram.main()
    bench_recipe.main()
    bench_presets.main([])  # (every preset: run.py's own arguments are not preset names)
    bench_versions.main()
    bench_remote.main()
    bench_ranged.main()
    bench_scale.main()
    bench_webdataset.main()
