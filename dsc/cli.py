"""The ``dsc`` command line. Thin: each command parses its arguments and makes one library call.

Library errors (``DscError``) and OS errors become a one-line message and exit code 1 in one place,
:meth:`DscGroup.invoke`; nothing a user can cause prints a traceback. Imports are lazy so that
``dsc --help`` and ``dsc compile`` never load torch.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import click

from . import __version__
from .errors import CompileLockedError, DscError


class DscGroup(click.Group):
    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except BrokenPipeError:  # `dsc info OUT | head`: the reader left; stop quietly
            sys.stdout = open(os.devnull, "w")
            ctx.exit(0)
        except DscError as e:
            raise click.ClickException(str(e)) from None
        except OSError as e:  # disk full, permissions, ...: the OS message names the file
            raise click.ClickException(str(e)) from None


class SizeParam(click.ParamType):
    """``224`` -> (224, 224); ``192,256`` or ``192x256`` -> (height 192, width 256)."""

    name = "H[,W]"

    def convert(self, value, param, ctx):
        if isinstance(value, tuple):
            return value
        parts = str(value).replace("x", ",").split(",")
        try:
            nums = tuple(int(p) for p in parts)
        except ValueError:
            self.fail(f"{value!r} is not SIZE or HEIGHT,WIDTH (e.g. 224 or 192,256)", param, ctx)
        if len(nums) == 1:
            nums = nums * 2
        if len(nums) != 2 or min(nums) < 1:
            self.fail(f"{value!r} is not SIZE or HEIGHT,WIDTH with positive integers", param, ctx)
        return nums


class RGBParam(click.ParamType):
    name = "R,G,B"

    def convert(self, value, param, ctx):
        if isinstance(value, tuple):
            return value
        try:
            rgb = tuple(int(v) for v in str(value).split(","))
        except ValueError:
            rgb = ()
        if len(rgb) != 3 or any(not 0 <= v <= 255 for v in rgb):
            self.fail(f"{value!r} is not three values 0..255 like 255,255,255", param, ctx)
        return rgb


def compile_options(f):
    """Options every ``dsc compile <source>`` command shares."""
    opts = [
        click.option("--size", type=SizeParam(), default=None,
                     help="Fixed shape: every image stored at SIZE x SIZE or HEIGHT,WIDTH."),
        click.option("--resize", type=click.Choice(["stretch", "center-crop", "pad"]), default="center-crop",
                     show_default=True, help="How --size is reached: stretch; resize the shorter side then "
                     "centre-crop (torchvision Resize+CenterCrop); pad (letterbox, aspect kept)."),
        click.option("--max-side", type=click.IntRange(min=1), default=None,
                     help="Ragged: keep aspect, cap the longest side (no resize when neither this nor --size)."),
        click.option("--mode", type=click.Choice(["RGB", "L"]), default="RGB", show_default=True,
                     help="Stored colour mode: RGB (3 channels) or L (grayscale, 1 channel)."),
        click.option("--fill", type=click.IntRange(0, 255), default=0, show_default=True,
                     help="Pixel value of the letterbox padding (--resize pad)."),
        click.option("--background", type=RGBParam(), default="255,255,255", show_default=True,
                     help="Colour transparent pixels are composited over."),
        click.option("--filter", "filter_", type=click.Choice(["bilinear", "bicubic", "lanczos", "nearest"]),
                     default="bilinear", show_default=True, help="Resampling filter (antialiased)."),
        click.option("--resizer", type=click.Choice(["pil", "torch"]), default="pil", show_default=True,
                     help="pil: PIL's resize, exactly torchvision's Resize on PIL images. torch: torch's "
                          "SIMD uint8 kernel (torchvision's Resize on tensors), about 3.5x faster; bilinear or "
                          "bicubic; bilinear within one level of pil."),
        click.option("--draft", is_flag=True,
                     help="JPEG draft decoding (DCT scaling by 1/2-1/8) when the output is at most half the "
                          "source: much faster for large photos, not pixel-identical to a full decode."),
        click.option("--shard-size", type=click.IntRange(min=1), default=None,
                     help="Samples per shard file (default: about 64 MiB of pixels, fewer for small datasets so "
                          "that there are ~32 shards to share among workers)."),
        click.option("--workers", type=click.IntRange(min=1), default=None,
                     help="Worker processes (default: number of cores)."),
        click.option("--on-error", type=click.Choice(["fail", "skip"]), default="fail", show_default=True,
                     help="fail: stop at the first bad input. skip: leave it out and record it in the manifest."),
        click.option("--error-report", type=click.Path(path_type=Path, dir_okay=False), default=None,
                     help="Also write every skipped input as a JSON line {key, reason} to this file."),
        click.option("--overwrite", is_flag=True, help="Replace OUT if it is an existing dsc dataset."),
        click.option("--resume", is_flag=True,
                     help="Continue an interrupted compile of the same inputs and options: finished shards "
                          "are verified (SHA-256) and kept, the rest compiled."),
        click.option("--executor", default=None, metavar="ADDRESS",
                     help="Run the shards on a Dask distributed cluster (tcp://scheduler:8786); OUT must be on a "
                          "filesystem the workers share. Needs dsc[dask]."),
        click.option("--quiet", "-q", is_flag=True, help="No progress bar."),
    ]
    for opt in reversed(opts):
        f = opt(f)
    return f


def _options_from(kw: dict):
    from .compiler import CompileOptions

    if kw["size"] is not None and kw["max_side"] is not None:
        raise click.UsageError("give either --size (fixed shape) or --max-side (ragged), not both")
    return CompileOptions(size=kw["size"], resize=kw["resize"], max_side=kw["max_side"], mode=kw["mode"],
                          fill=kw["fill"], background=kw["background"], filter=kw["filter_"],
                          resizer=kw["resizer"], draft=kw["draft"], shard_size=kw["shard_size"],
                          workers=kw["workers"], on_error=kw["on_error"],
                          error_report=str(kw["error_report"]) if kw["error_report"] else None,
                          overwrite=kw["overwrite"], resume=kw["resume"], progress=not kw["quiet"],
                          executor=kw["executor"])


def _mb(n: int) -> str:
    return f"{n / 1e6:,.1f} MB" if n >= 1e5 else f"{n / 1e3:,.1f} kB"


def _n(count: int, word: str) -> str:
    """'1 shard', '3 shards'."""
    return f"{count:,} {word}{'' if count == 1 else 's'}"


def _describe_image(m) -> str:
    im, r = m.image, m.resize
    how = f"{r.filter} ({r.resizer}{', JPEG draft' if m.source.get('options', {}).get('draft') else ''})"
    if im.layout == "fixed":
        return f"fixed {im.height}x{im.width}x{im.channels} uint8 ({im.mode}), resize {r.policy}, {how}"
    cap = f"longest side <= {r.max_side}, {how}" if r.max_side else "stored as decoded"
    return f"ragged (h, w, {im.channels}) uint8 ({im.mode}), {cap}"


def _describe_objects(m) -> str:
    o = m.objects
    return (f"{_n(o['num_boxes'], 'box')[:-1] + ('es' if o['num_boxes'] != 1 else '')} "
            f"({o['dropped_boxes']} dropped by the resize), {_n(o['images_without_boxes'], 'image')} without boxes")


def _report(report) -> None:
    m = report.manifest
    if report.resumed_units:
        click.echo(f"resumed: {_n(report.resumed_units, 'finished shard')} verified and kept")
    click.echo(f"compiled {_n(m.num_samples, 'image')} into {report.path} ({_describe_image(m)}; "
               f"{_n(len(m.shards), 'shard')}, {_mb(report.bytes_written)}) in {report.seconds:.1f} s: "
               f"{report.images_per_second:,.0f} img/s")
    if m.objects is not None:
        click.echo(f"objects: {_describe_objects(m)}")
    if report.skipped:
        click.echo(f"skipped {_n(len(report.skipped), 'bad input')} (all recorded in the manifest; "
                   f"list them with `dsc info {report.path} --skipped`):", err=True)
        for s in report.skipped[:10]:
            click.echo(f"  {s['key']}: {s['reason']}", err=True)
        if len(report.skipped) > 10:
            click.echo(f"  ... and {len(report.skipped) - 10} more", err=True)


@click.group(cls=DscGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="dsc")
def main():
    """dsc: compile image datasets once into memory-mappable shards; train with zero decoding."""


@main.group(name="compile", cls=DscGroup)
def compile_group():
    """Compile a dataset: decode every image once into Zarr v3 shards at OUT."""


def _compile(out: Path, kw: dict, scan, drop_empty: bool = False) -> None:
    """Shared by every ``dsc compile <source>``: validate options, refuse an existing OUT before a long
    scan, print the source's warnings, compile, report."""
    from .compiler import compile_source
    from .compiler.staging import staging_dir

    warn = lambda msg: click.echo(f"warning: {msg}", err=True)  # noqa: E731
    try:
        report = compile_source(scan, out, _options_from(kw), drop_empty, warn=warn)
    except (DscError, OSError, KeyboardInterrupt) as e:
        partial = staging_dir(out)
        if partial.exists() and not isinstance(e, CompileLockedError):  # a locked-out compile touched nothing
            click.echo(f"note: the finished shards are kept in {partial}; rerun the same command with --resume "
                       f"to continue, or without it to start over", err=True)
        raise
    _report(report)


drop_empty_option = click.option("--drop-empty", is_flag=True,
                                 help="Leave out images without boxes (kept as negatives by default).")


@compile_group.command(name="imagefolder")
@click.argument("src", type=click.Path(path_type=Path, file_okay=False))
@click.argument("out", type=click.Path(path_type=Path))
@compile_options
def compile_imagefolder_cmd(src: Path, out: Path, **kw):
    """Compile a torchvision ImageFolder tree: SRC/<class>/<image>.

    Classes are the sorted sub-folder names; images are the files with an image extension
    (.jpg .jpeg .png .ppm .bmp .pgm .tif .tiff .webp, any case). Hidden entries are ignored.
    """
    from .compiler import scan_imagefolder

    _compile(out, kw, lambda: scan_imagefolder(src))


@compile_group.command(name="coco")
@click.option("--annotations", required=True, type=click.Path(path_type=Path, dir_okay=False),
              help="COCO instances JSON (images, annotations, categories).")
@click.option("--images", required=True, type=click.Path(path_type=Path, file_okay=False),
              help="Folder the JSON's file_name entries are relative to.")
@click.argument("out", type=click.Path(path_type=Path))
@click.option("--keep-category-ids", is_flag=True,
              help="Store COCO's original category ids as labels (default: contiguous 0..C-1).")
@drop_empty_option
@compile_options
def compile_coco_cmd(annotations: Path, images: Path, out: Path, keep_category_ids: bool, drop_empty: bool, **kw):
    """Compile a COCO detection set: boxes follow every resize and EXIF rotation."""
    from .compiler import scan_coco

    _compile(out, kw, lambda: scan_coco(annotations, images, keep_category_ids), drop_empty)


@compile_group.command(name="yolo")
@click.argument("root", type=click.Path(path_type=Path, file_okay=False))
@click.argument("out", type=click.Path(path_type=Path))
@click.option("--split", default="train", show_default=True, help="Split key of data.yaml (train, val, test).")
@click.option("--data", "data_yaml", type=click.Path(path_type=Path, dir_okay=False), default=None,
              help="data.yaml (default: ROOT/data.yaml).")
@click.option("--classes-file", type=click.Path(path_type=Path, dir_okay=False), default=None,
              help="Class names, one a line, instead of data.yaml (images in ROOT/images/SPLIT).")
@drop_empty_option
@compile_options
def compile_yolo_cmd(root: Path, out: Path, split: str, data_yaml, classes_file, drop_empty: bool, **kw):
    """Compile a YOLO dataset (data.yaml + images/ + labels/, Ultralytics layout)."""
    from .compiler import scan_yolo

    _compile(out, kw, lambda: scan_yolo(root, split, data_yaml, classes_file), drop_empty)


@compile_group.command(name="voc")
@click.argument("root", type=click.Path(path_type=Path, file_okay=False))
@click.argument("out", type=click.Path(path_type=Path))
@click.option("--split", default="trainval", show_default=True, help="ImageSets/Main/<split>.txt.")
@click.option("--classes", default=None, help="Comma-separated class list (default: the sorted names found).")
@drop_empty_option
@compile_options
def compile_voc_cmd(root: Path, out: Path, split: str, classes: str | None, drop_empty: bool, **kw):
    """Compile a Pascal VOC split (Annotations/, JPEGImages/, ImageSets/Main/)."""
    from .compiler import scan_voc

    names = [c.strip() for c in classes.split(",") if c.strip()] if classes else None
    _compile(out, kw, lambda: scan_voc(root, split, names), drop_empty)


@main.command(name="verify")
@click.argument("dataset", type=click.Path(path_type=Path))
def verify_cmd(dataset: Path):
    """Re-hash every shard and file against the manifest and check every invariant.

    Exit code 0 when the dataset is intact, 1 when anything is damaged (each problem is listed with the
    file and the samples affected)."""
    from .formats.verify import verify

    report = verify(dataset)
    if report.ok:
        click.echo(f"OK: {report.shards_checked} shards and {report.files_checked} files of {dataset} match the "
                   f"manifest ({report.bytes_hashed / 1e6:,.1f} MB hashed); all invariants hold")
        return
    for p in report.problems:
        click.echo(f"DAMAGED {p}")
    n = len(report.damaged_samples)
    raise click.ClickException(f"{dataset} is damaged: {len(report.problems)} problems"
                               + (f", {n} samples affected" if n else "") + "; recompile it")


@main.command(name="bench")
@click.argument("dataset", type=click.Path(path_type=Path))
@click.option("--batch-size", type=click.IntRange(min=1), default=256, show_default=True)
@click.option("--order", type=click.Choice(["sequential", "random", "quasi_random"]), default="random",
              show_default=True)
@click.option("--threads", type=click.IntRange(min=1), default=2, show_default=True, help="Loader threads.")
@click.option("--prefetch", type=click.IntRange(min=1), default=3, show_default=True)
@click.option("--epochs", type=click.IntRange(min=1), default=3, show_default=True, help="Timed epochs (best is kept).")
def bench_cmd(dataset: Path, batch_size: int, order: str, threads: int, prefetch: int, epochs: int):
    """Loader images/s and GB/s beside the machine's copy limit and a PIL-decoding DataLoader."""
    from .bench import run_bench

    run_bench(dataset, batch_size=batch_size, order=order, num_threads=threads, prefetch=prefetch,
              epochs=epochs, echo=click.echo)


@compile_group.command(name="table")
@click.argument("path", type=click.Path(path_type=Path))
@click.argument("out", type=click.Path(path_type=Path))
@click.option("--image-column", default="image", show_default=True,
              help="Column of encoded image bytes (or Hugging Face Image structs).")
@click.option("--label-column", default="label", show_default=True, help="Integer class column.")
@click.option("--no-label", is_flag=True, help="The table has no labels (images only).")
@click.option("--key-column", default=None, help="Column stored as each sample's key (default: file#row).")
@click.option("--classes", default=None, help="Comma-separated class names (default: the table's ClassLabel).")
@compile_options
def compile_table_cmd(path: Path, out: Path, image_column: str, label_column: str, no_label: bool,
                      key_column, classes, **kw):
    """Compile a Parquet / Arrow table (a file or a folder of files) of image bytes. Needs dsc[table]."""
    from .compiler import scan_table

    names = [c.strip() for c in classes.split(",")] if classes else None
    _compile(out, kw, lambda: scan_table(path, image_column, None if no_label else label_column, key_column, names))


@main.command(name="preview")
@click.argument("dataset", type=click.Path(path_type=Path))
@click.option("-o", "--output", type=click.Path(path_type=Path, dir_okay=False), default=Path("preview.png"),
              show_default=True, help="PNG to write.")
@click.option("--n", "n", type=click.IntRange(min=1), default=16, show_default=True, help="Number of samples.")
@click.option("--cols", type=click.IntRange(min=1), default=None, help="Grid columns (default: square).")
@click.option("--cell", type=click.IntRange(min=16), default=256, show_default=True, help="Cell size in pixels.")
@click.option("--seed", type=int, default=None,
              help="Draw N random samples with this seed (default: the first N, often all of one class).")
def preview_cmd(dataset: Path, output: Path, n: int, cols, cell: int, seed):
    """Draw a grid of samples with boxes and class names (detection) or class names (classification)."""
    from .runtime import open as open_dataset
    from .runtime.preview import preview

    path = preview(open_dataset(dataset), output, n=n, cols=cols, cell=cell, seed=seed)
    click.echo(f"wrote {path}")


@main.command()
@click.argument("dataset", required=False, type=click.Path(path_type=Path))
@click.option("--env", "show_env", is_flag=True, help="Show the software dsc runs on (PIL build, libjpeg, torch).")
@click.option("--skipped", is_flag=True, help="List every input left out at compile time, with the reason.")
@click.option("--json", "as_json", is_flag=True, help="Print the manifest (or environment) as JSON.")
def info(dataset: Path | None, show_env: bool, skipped: bool, as_json: bool):
    """Describe a compiled DATASET: schema, counts, bytes, classes, shards, and the dsc + PIL build."""
    from .env import environment, pil_build

    if dataset is None and not show_env:
        raise click.UsageError("give a DATASET, or --env for the environment")
    if show_env:
        env = environment()
        if as_json:
            click.echo(json.dumps(env, indent=2))
        else:
            width = max(map(len, env)) + 2
            for k, v in env.items():
                click.echo(f"{k:{width}}{v}")
        if dataset is None:
            return
    from .formats.layout import check_shard_files, read_manifest

    m = read_manifest(dataset)
    if as_json:
        click.echo(json.dumps(m.to_dict(), indent=2, ensure_ascii=False))
        return
    if skipped:
        for s in m.skipped:
            click.echo(f"{s['key']}\t{s['reason']}")
        if not m.skipped:
            click.echo("no input was skipped", err=True)
        return
    check_shard_files(dataset, m)
    pil = pil_build()
    total = sum(s.nbytes for s in m.shards)
    cls = ", ".join(m.classes[:12]) + (", ..." if len(m.classes) > 12 else "")
    rows = [
        ("dataset", str(dataset)),
        ("format", f"dsc format v{m.format_version} (Zarr v3 group), written by dsc {m.dsc_version}"),
        ("task", m.task),
        ("samples", f"{m.num_samples:,} in {_n(len(m.shards), 'shard')} of up to {m.shard_size}"),
        ("image", _describe_image(m)),
        ("bytes", f"{_mb(total)} of shards (all present, sizes match the manifest)"),
        ("classes", f"{len(m.classes)}: {cls}" if m.classes else "none"),
        *([("objects", _describe_objects(m))] if m.objects is not None else []),
        ("source", " ".join(f"{k}={v}" for k, v in m.source.items() if k != "options")),
        ("skipped", f"{len(m.skipped)}" + (" (dsc info --skipped lists them)" if m.skipped else "")),
        ("reader", f"dsc {__version__} on {pil['pil_distribution']} {pil['pil_version']}"
                   f" (libjpeg-turbo {pil['libjpeg_turbo']})"),
    ]
    for k, v in rows:
        click.echo(f"{k:10}{v}")


if __name__ == "__main__":  # pragma: no cover
    main()
