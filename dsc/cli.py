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
from .errors import (CompileLockedError, ConfigError, CredentialsError, DatasetNotFoundError, DscError, OutputExistsError,
                     ResumeError, SampleError, UnsafePathError, VersionConflictError, VersionNotFoundError)


def _warning_line(message, category, filename, lineno, file=None, line=None):
    """Warnings as the CLI's one-line notes (no source location: it would be dsc's, not the user's)."""
    click.echo(f"warning: {message}", err=True)


class DscGroup(click.Group):
    def invoke(self, ctx):
        import warnings

        warnings.showwarning = _warning_line
        try:
            return super().invoke(ctx)
        except BrokenPipeError:  # `dsc info OUT | head`: the reader left; stop quietly
            sys.stdout = open(os.devnull, "w")
            ctx.exit(0)
        except DscError as e:
            raise click.ClickException(str(e)) from None
        except OSError as e:  # disk full, permissions, ...: the OS message names the file
            raise click.ClickException(str(e)) from None
        except KeyboardInterrupt:  # Ctrl-C: what shells expect (128 + SIGINT), not a failure's 1
            click.echo("Aborted!", err=True)
            ctx.exit(130)


class DatasetParam(click.ParamType):
    """A dataset's place: a local path (a Path), or an object-storage URL kept as text (s3://, gs://, az://;
    a Path would fold its '//')."""

    name = "PATH|URL"

    def convert(self, value, param, ctx):
        from .store import is_url, local_path, url_typo  # lazy: numpy, for dsc --help's speed

        if is_url(value):
            scheme, rest = value.split("://", 1)
            return f"{scheme.lower()}://{rest.rstrip('/')}"
        meant = url_typo(value)
        if meant:
            self.fail(f"{value!r} is not a URL: did you mean {meant}? (a local folder of that name: ./{value})",
                      param, ctx)
        if isinstance(value, Path):
            return value
        return Path(local_path(value))


DATASET = DatasetParam()


class InputParam(DatasetParam):
    """A source's input: a local path (a Path), or an object-storage URL kept as text (the source reads it
    from the bucket); ``s3:/x`` style mistakes are refused with the URL meant."""

    def __init__(self, kind: str):
        self.name = {"dir": "DIR|URL", "file": "FILE|URL"}.get(kind, "PATH|URL")


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


def compile_options(f, masks: bool = True):
    """Options every ``dsc compile <source>`` command shares: the CompileOptions fields (``--mask-ignore`` only
    for a source that can make masks)."""
    from .compiler.options import ON_ERROR  # lazy: PIL, for the compile commands
    from .compiler.resample import FILTERS  # lazy: PIL, for the compile commands
    from .formats.manifest import RESIZE_POLICIES, RESIZERS  # lazy: numpy, for dsc --help's speed

    opts = [
        click.option("--size", type=SizeParam(), default=None,
                     help="Fixed shape: every image stored at SIZE x SIZE or HEIGHT,WIDTH."),
        click.option("--resize", type=click.Choice(RESIZE_POLICIES), default="center-crop",
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
        click.option("--filter", "filter_", type=click.Choice(list(FILTERS)),
                     default="bilinear", show_default=True, help="Resampling filter (antialiased)."),
        click.option("--resizer", type=click.Choice(RESIZERS), default="pil", show_default=True,
                     help="pil: PIL's resize, exactly torchvision's Resize on PIL images. torch: torch's "
                          "SIMD uint8 kernel (torchvision's Resize on tensors), about 3.5x faster; bilinear or "
                          "bicubic; bilinear within one level of pil."),
        click.option("--draft", is_flag=True,
                     help="JPEG draft decoding (DCT scaling by 1/2-1/8) when the output is at most half the "
                          "source: much faster for large photos, not pixel-identical to a full decode."),
        *([click.option("--mask-ignore", type=click.IntRange(0, 65535), default=255, show_default=True,
                        help="Mask value of 'no class': letterbox padding, crowd regions, VOC borders.")]
          if masks else []),
        click.option("--max-pixels", type=click.IntRange(min=1), default=None,
                     help="An image with more pixels is a bad sample (default: PIL's decompression-bomb limit, "
                          "about 89 million)."),
        click.option("--shard-size", type=click.IntRange(min=1), default=None,
                     help="Samples per shard file, at most the number of inputs (default: about 64 MiB of "
                          "pixels, fewer for small datasets so that there are ~32 shards to share among workers)."),
        click.option("--workers", type=click.IntRange(min=1), default=None,
                     help="Worker processes (default: number of cores)."),
        click.option("--on-error", type=click.Choice(ON_ERROR), default="fail", show_default=True,
                     help="fail: stop at the first bad input. skip: leave it out and record it in the manifest."),
        click.option("--error-report", type=click.Path(path_type=Path, dir_okay=False), default=None,
                     help="Also write every skipped input as a JSON line {key, reason} to this file."),
        click.option("--overwrite", is_flag=True, help="Replace OUT if it is an existing dsc dataset (not for a URL: "
                                                       "versions in object storage are never overwritten)."),
        click.option("--update", is_flag=True,
                     help="Make the next version of OUT from the source as it is now: only new or changed inputs "
                          "are decoded (the options OUT was compiled with are kept). Without OUT: a first compile."),
        click.option("--dry-run", is_flag=True, help="With --update: print what it would do, change nothing."),
        click.option("--resume", is_flag=True,
                     help="Continue an interrupted compile of the same inputs and options: finished shards "
                          "are verified (SHA-256) and kept, the rest compiled."),
        click.option("--executor", default=None, metavar="ADDRESS",
                     help="Run the shards on a Dask distributed cluster (tcp://scheduler:8786). With the inputs "
                          "and OUT in object storage the workers need no shared filesystem (each uploads its own "
                          "shards); else OUT and the inputs must be on a filesystem the workers share. Needs "
                          "dsc[dask]."),
        click.option("--cache-dir", type=click.Path(path_type=Path, file_okay=False), default=None,
                     help="OUT is a URL (s3://, gs://, az://): stage the shards here before they are uploaded "
                          "(default: $DSC_CACHE_DIR, else $XDG_CACHE_HOME/dsc, else ~/.cache/dsc)."),
        click.option("--quiet", "-q", is_flag=True, help="No progress bar."),
    ]
    for opt in reversed(opts):
        f = opt(f)
    return f


COMPILE_OPTION_KEYS = ("size", "resize", "max_side", "mode", "fill", "background", "filter_", "resizer", "draft",
                       "mask_ignore", "max_pixels", "shard_size", "workers", "on_error", "error_report", "overwrite", "resume",
                       "executor", "quiet", "update", "dry_run", "cache_dir")


def _options_from(kw: dict):
    from .compiler import CompileOptions  # lazy: PIL, for the compile commands

    if kw["size"] is not None and kw["max_side"] is not None:
        raise click.UsageError("give either --size (fixed shape) or --max-side (ragged), not both")
    ctx = click.get_current_context(silent=True)
    given = tuple(sorted(("filter" if k == "filter_" else k) for k in kw if ctx is not None and ctx.get_parameter_source(k)
                         == click.core.ParameterSource.COMMANDLINE))
    return CompileOptions(size=kw["size"], resize=kw["resize"], max_side=kw["max_side"], mode=kw["mode"],
                          fill=kw["fill"], background=kw["background"], filter=kw["filter_"],
                          resizer=kw["resizer"], draft=kw["draft"], mask_ignore=kw.get("mask_ignore", 255), max_pixels=kw["max_pixels"],
                          shard_size=kw["shard_size"],
                          workers=kw["workers"], on_error=kw["on_error"],
                          error_report=str(kw["error_report"]) if kw["error_report"] else None,
                          overwrite=kw["overwrite"], resume=kw["resume"], progress=not kw["quiet"],
                          executor=kw["executor"], update=kw["update"], dry_run=kw["dry_run"], explicit=given,
                          cache_dir=str(kw["cache_dir"]) if kw.get("cache_dir") else None)


def _mb(n: int) -> str:
    return f"{n / 1e6:,.1f} MB" if n >= 1e5 else f"{n / 1e3:,.1f} kB"


def _n(count: int, word: str, plural: str | None = None) -> str:
    """'1 shard', '3 shards', '1 box', '2 boxes'."""
    return f"{count:,} {word if count == 1 else plural or word + 's'}"


def _describe_image(m) -> str:
    im, r = m.image, m.resize
    how = f"{r.filter} ({r.resizer}{', JPEG draft' if m.source.get('options', {}).get('draft') else ''})"
    if im.layout == "fixed":
        return f"fixed {im.height}x{im.width}x{im.channels} uint8 ({im.mode}), resize {r.policy}, {how}"
    cap = f"longest side <= {r.max_side}, {how}" if r.max_side else "stored as decoded"
    return f"ragged (h, w, {im.channels}) uint8 ({im.mode}), {cap}"


def _describe_objects(m, path=None, version: int | None = None) -> str:
    """The boxes of the version's samples. The manifest counts box rows, which after an update include those of
    removed samples and holes: a local dataset (``path``) is opened to count its live samples' boxes instead."""
    o = m.objects
    boxes, empty, note = o["num_boxes"], o["images_without_boxes"], ""
    if m.versioned and m.num_rows != m.num_samples:
        from .store import is_url  # lazy: numpy, for dsc --help's speed

        if path is not None and not is_url(str(path)):
            from .runtime.dataset import open as open_dataset  # lazy: torch, for dsc --help's speed

            with open_dataset(path, version=version) as ds:
                counts = ds.box_counts()
                boxes, empty = int(counts.sum()), int((counts == 0).sum())
        else:
            note = f" (box rows, counting those of the {m.num_rows - m.num_samples:,} rows not live)"
    return (f"{_n(boxes, 'box', 'boxes')}{note} "
            f"({o['dropped_boxes']} dropped by the resize), {_n(empty, 'image')} without boxes")


def _extra_fields(m) -> list[tuple[str, str]]:
    """(name, description) of the fields beyond image, label and objects (masks...)."""
    from .formats.fields import fields_of  # lazy: numpy, for dsc --help's speed

    return [(f.name, f.describe()) for f in fields_of(m) if f.kind not in ("image", "label", "objects")]


def _report(report) -> None:
    m = report.manifest
    if report.resumed_units:
        click.echo(f"resumed: {_n(report.resumed_units, 'finished shard')} verified and kept")
    if report.uploaded is not None:
        u = report.uploaded
        click.echo(f"uploaded {_n(u['sent'], 'file')} ({_mb(u['bytes_sent'])})" + (
            f"; {_n(u['kept'], 'file was', 'files were')} in the bucket already (same SHA-256) and not sent again"
            if u["kept"] else ""))
    if report.plan is not None and not report.committed:
        click.echo("dry run: nothing was changed" if report.dry_run else
                   f"{report.path} is up to date with its source (version {report.version}); nothing to do")
        return
    if report.plan is not None:
        p = report.plan
        decoded = p["decoded"] if report.decoded is None else report.decoded
        new = m.shard_count - report.reused_shards - report.resumed_units
        click.echo(f"version {report.version} of {report.path}: {_n(m.num_samples, 'image')} "
                   f"({_describe_image(m)}); decoded {decoded:,} in {report.seconds:.1f} s, wrote "
                   f"{_mb(report.bytes_written)} in {_n(new, 'new shard')}"
                   + (f" (and kept {report.resumed_units:,} from the interrupted run)" if report.resumed_units else ""))
    else:
        this_run = (f"{report.decoded:,} decoded by this run, " if report.resumed_units else "")
        click.echo(f"compiled {_n(m.num_samples, 'image')} into {report.path} ({_describe_image(m)}; "
                   f"{_n(m.shard_count, 'shard')}, {_mb(report.bytes_written)}) in {report.seconds:.1f} s: "
                   f"{this_run}{report.images_per_second:,.0f} img/s")
    if m.objects is not None:
        click.echo(f"objects: {_describe_objects(m, report.path)}")
    for name, desc in _extra_fields(m):
        click.echo(f"{name}: {desc}")
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


def _param_decorator(p):
    """A source's declared parameter as a click argument or option."""
    kinds = {"dir": InputParam("dir"), "file": InputParam("file"), "path": InputParam("path"), "int": int, "str": str,
             "csv": str}
    if p.argument:
        return click.argument(p.name, type=kinds.get(p.type, str), metavar=p.metavar)
    if p.type == "flag":
        return click.option(p.option, p.name, is_flag=True, default=bool(p.default), help=p.help)
    kind = click.Choice(p.choices) if p.type == "choice" else kinds.get(p.type, str)
    if getattr(p, "multiple", False):  # given once per value: --column a --column b
        return click.option(p.option, p.name, type=kind, multiple=True, help=p.help, metavar=p.metavar)
    if p.type == "choice" and p.flag_value is not None:  # `--masks` alone, or `--masks instance`
        return click.option(p.option, p.name, type=kind, is_flag=False, flag_value=p.flag_value, default=None,
                            help=p.help)
    default = ",".join(p.default) if p.type == "csv" and p.default else p.default
    # (no default=None given: click 8.3+ takes an explicit None for a value, and a required option left out would
    # reach the source, whose message names the Python keyword instead of the flag)
    return click.option(p.option, p.name, type=kind, **({} if default is None else {"default": default}),
                        required=p.required, help=p.help, show_default=default not in (None, ""), metavar=p.metavar)


def source_command(cls) -> click.Command:
    """``dsc compile <name>`` for a registered source: its parameters, OUT, then the compile options."""
    def callback(out: Path, **kw):
        source_kw = {k: v for k, v in kw.items() if k not in COMPILE_OPTION_KEYS}
        options = {k: v for k, v in kw.items() if k in COMPILE_OPTION_KEYS}
        _compile(out, options, lambda: cls.from_cli(**source_kw))

    f = callback
    f = compile_options(f, masks=cls.makes_masks)
    f = click.argument("out", type=DATASET)(f)
    for p in reversed([p for p in cls.params if p.cli and not p.argument]):
        f = _param_decorator(p)(f)
    for p in reversed([p for p in cls.params if p.cli and p.argument]):
        f = _param_decorator(p)(f)
    doc = (cls.__doc__ or cls.name).strip()
    return click.command(name=cls.name, help=doc, short_help=cls.summary())(f)


class CompileGroup(DscGroup):
    """``dsc compile``: one command per registered source, built-in or from a plugin (entry points)."""

    def list_commands(self, ctx):
        from .compiler.sources import sources  # lazy: PIL, for the compile commands

        return [name for name, cls in sources().items() if cls.cli]

    def get_command(self, ctx, name):
        from .compiler.sources import sources  # lazy: PIL, for the compile commands

        cls = sources().get(name)
        return source_command(cls) if cls is not None and cls.cli else None

    def resolve_command(self, ctx, args):
        """``dsc compile imagefoldr``: the source meant, and every source (click suggests only among commands
        it holds, and these are made on demand)."""
        from .compiler.sources import unknown_source  # lazy: PIL, for the compile commands

        if args and not args[0].startswith("-") and self.get_command(ctx, args[0]) is None:
            ctx.fail(unknown_source(args[0], self.list_commands(ctx)))
        return super().resolve_command(ctx, args)


@main.group(name="compile", cls=CompileGroup)
def compile_group():
    """Compile a dataset: decode every image once into Zarr v3 shards at OUT.

    Every source below is one command; third-party sources appear here once installed (entry-point
    group dsc.sources)."""


def _compile(out: Path, kw: dict, make_source) -> None:
    """Shared by every ``dsc compile <source>``: validate options, refuse an existing OUT before a long
    scan, print the source's warnings, compile, report."""
    from .compiler import compile_source  # lazy: PIL, for the compile commands
    from .compiler.staging import staging_dir  # lazy: PIL, for the compile commands

    warn = lambda msg: click.echo(f"warning: {msg}", err=True)  # noqa: E731
    options = _options_from(kw)
    if options.overwrite and not options.update and not options.dry_run:
        _confirm_overwrite(out)
    try:
        report = compile_source(make_source(), out, options, warn=warn, info=click.echo)
    except (DscError, OSError, KeyboardInterrupt) as e:
        from .store import is_url  # lazy: numpy, for dsc --help's speed

        if is_url(out):
            if not isinstance(e, (ConfigError, CredentialsError, DatasetNotFoundError, OutputExistsError,
                                  VersionConflictError)) and not options.update:
                click.echo(f"note: nothing is published at {out} until the compile ends; rerun the same command "
                           f"with --resume to continue (finished shards, local and uploaded, are kept)", err=True)
            raise

        partial = staging_dir(out)
        # a locked-out compile touched nothing; a refused --resume says itself that --resume cannot help; one
        # refused for a link there has nothing to resume
        if partial.is_dir() and not partial.is_symlink() and not isinstance(
                e, (CompileLockedError, ResumeError, UnsafePathError)):
            if isinstance(e, SampleError):  # (removing the input changes the inputs: a resume would be refused)
                click.echo(f"note: the finished shards are kept in {partial}; fix that input in place (or pass "
                           f"--on-error skip) and rerun the same command with --resume to continue; after removing "
                           f"it, rerun without --resume", err=True)
            else:
                click.echo(f"note: the finished shards are kept in {partial}; rerun the same command with --resume "
                           f"to continue, or without it to start over", err=True)
        raise
    _report(report)


def _at_a_terminal() -> bool:
    return sys.stdin.isatty()


def _confirm_overwrite(out) -> None:
    """``--overwrite`` of a dataset with more than its one version, or with tags, drops them all: asked at a
    terminal, refused elsewhere (a script removes OUT itself, or makes a new version with --update)."""
    from .compiler.staging import history  # lazy: PIL, for the compile commands
    from .store import is_url  # lazy: numpy, for dsc --help's speed

    lost = None if is_url(str(out)) else history(out)
    if lost is None:
        return
    said = f"{out} holds {lost}; --overwrite replaces it with a new compile (version 0, no tags) and drops them all"
    if _at_a_terminal():
        click.confirm(f"{said}. Replace it?", abort=True, err=True)
        return
    raise click.ClickException(f"{said}: not without a confirmation, and there is no terminal to ask at. Make a new "
                               f"version with --update instead, or remove {out} first (rm -r) to compile it anew")


VERIFY_NOT_FOUND = 3  # dsc verify's exit code for a version (or dataset) that is not there; 1 is "damaged"


@main.command(name="verify")
@click.argument("dataset", type=DATASET)
@click.option("--version", "version", type=click.IntRange(min=0), default=None,
              help="Check this version (default: the latest, and the top-level plain-Zarr view with it).")
@click.option("--repair-view", is_flag=True,
              help="Rewrite the top-level plain-Zarr view as the latest version (after a crash while it was "
                   "refreshed, or a plain Zarr writer changed it); versions themselves are never touched.")
@click.option("--cache-dir", type=click.Path(path_type=Path, file_okay=False), default=None,
              help="DATASET is a URL: where its small files are kept (default: $DSC_CACHE_DIR or ~/.cache/dsc).")
@click.option("--quiet", "-q", is_flag=True, help="Print nothing when the dataset is intact (the exit code says so); "
                                                  "problems are still listed.")
def verify_cmd(dataset: Path, version, repair_view: bool, cache_dir, quiet: bool = False):
    """Re-hash every shard and file against the manifest and check every invariant. DATASET may be a URL
    (s3://, gs://, az://): every shard is streamed from object storage and hashed.

    Exit code 0 when the dataset is intact, 1 when anything is damaged (each problem is listed with the
    file and the samples affected), 3 when there is no such version (removed by `dsc vacuum`, or never made):
    nothing to check is not damage."""
    from .formats.verify import verify  # lazy: numpy, for dsc --help's speed
    from .store import is_url  # lazy: numpy, for dsc --help's speed

    if repair_view:
        from .versions import repair_view as repair  # lazy: numpy, for dsc --help's speed

        click.echo(f"the top-level view of {dataset} now shows version {repair(dataset)}")
    try:
        report = verify(dataset, version, cache_dir=cache_dir)
    except VersionNotFoundError as e:
        missing = click.ClickException(f"{e} (exit code 3: nothing to check, not damage)")
        missing.exit_code = VERIFY_NOT_FOUND
        raise missing from None
    what = f"version {report.version} of {dataset}" if report.version is not None else str(dataset)
    view_only = report.problems and all(p.view for p in report.problems)
    if report.ok:
        if quiet:
            return
        click.echo(f"OK: {report.shards_checked} shard files and {report.files_checked} other files of {what} match "
                   f"the manifest ({report.bytes_hashed / 1e6:,.1f} MB hashed); all invariants hold")
        return
    for p in report.problems:
        click.echo(f"DAMAGED {p}")
    if view_only:
        raise click.ClickException(f"the top-level view of {dataset} (what plain Zarr readers open) differs from "
                                   f"version {report.version}, which is itself intact: run `dsc verify {dataset} "
                                   f"--repair-view`")
    if all(p.view or p.tag for p in report.problems):
        raise click.ClickException(f"{what} is intact, but the dataset's tags or view are not: each line above says "
                                   f"how to fix it")
    n = len(report.damaged_samples)
    k = len(report.problems)
    raise click.ClickException(f"{what} is damaged: {k} problem{'s' if k != 1 else ''}"
                               + (f", {n} sample{'s' if n != 1 else ''} affected" if n else "")
                               + "; `dsc restore` an intact version (dsc verify --version N checks one), put the "
                                 "damaged files back from a copy, or compile again "
                               + ("into a new folder" if not is_url(dataset) else "to a new URL"))


def _counts(e: dict) -> str:
    parts = [f"{e['samples']:,} samples"]
    for key, sign in (("added", "+"), ("removed", "-"), ("changed", "~")):
        if e.get(key):
            parts.append(f"{sign}{e[key]:,}")
    if e.get("relabelled"):
        parts.append(f"{e['relabelled']:,} relabelled")
    if e.get("moved"):
        parts.append(f"{e['moved']:,} moved")
    if "decoded" in e:
        parts.append(f"{e['decoded']:,} decoded")
    if e.get("skipped"):
        parts.append(f"{e['skipped']:,} skipped")
    return " ".join(parts)


@main.command(name="log")
@click.argument("dataset", type=DATASET)
@click.option("--json", "as_json", is_flag=True, help="Print the history as JSON.")
@click.option("--quiet", "-q", is_flag=True, help="One line per version (no option lines).")
def log_cmd(dataset: Path, as_json: bool, quiet: bool = False):
    """The versions of DATASET (a folder or an s3:// gs:// az:// URL), oldest first: time, operation, counts
    (+added -removed ~changed against the parent), the source's version, options and tags."""
    from .versions import log  # lazy: numpy, for dsc --help's speed

    entries = log(dataset)
    if as_json:
        click.echo(json.dumps(entries, indent=2, ensure_ascii=False))
        return
    prev = None
    for e in entries:
        tags = f" [{', '.join(e['tags'])}]" if e.get("tags") else ""
        src = f" table version {e['source_version']}" if e.get("source_version") is not None else ""
        click.echo(f"version {e['version']}{tags}  {e['created'] or '-'}  {e['operation']}: {_counts(e)}{src}")
        if not quiet and e.get("options") and (e["version"] == entries[0]["version"] or e["options"] != prev):
            click.echo("  options: " + " ".join(f"{k}={v}" for k, v in e["options"].items()))
        prev = e.get("options")


@main.command(name="tag")
@click.argument("dataset", type=DATASET)
@click.argument("name")
@click.option("--version", "version", type=click.IntRange(min=0), default=None,
              help="The version to name (default: the latest).")
@click.option("--delete", is_flag=True, help="Remove the tag NAME (the version stays).")
@click.option("--quiet", "-q", is_flag=True, help="Print nothing on success.")
def tag_cmd(dataset: Path, name: str, version, delete: bool, quiet: bool = False):
    """Name a version of DATASET (a folder or a URL); `dsc.open(..., tag=NAME)` opens it and `dsc vacuum` never
    removes it."""
    from .formats.versions import tag_names  # lazy: numpy, for dsc --help's speed
    from .versions import tag  # lazy: numpy, for dsc --help's speed

    before = tag_names(dataset).get(name)
    n = tag(dataset, name, version, delete=delete)
    if quiet:
        return
    if delete:
        click.echo(f"removed tag {name!r}" + (f" (it named version {before})" if before is not None else ""))
    elif before is not None and before != n:
        click.echo(f"moved tag {name!r} from version {before} to version {n} of {dataset}")
    else:
        click.echo(f"tagged version {n} of {dataset} as {name!r}")


@main.command(name="restore")
@click.argument("dataset", type=DATASET)
@click.option("--version", "version", type=click.IntRange(min=0), default=None, help="The version to restore.")
@click.option("--tag", "tag_name", default=None, help="The tagged version to restore.")
def restore_cmd(dataset: Path, version, tag_name):
    """Make a new version of DATASET whose content is an earlier version's (nothing decoded or copied).
    DATASET may be a URL (s3://, gs://, az://): only the new version record and the view are written."""
    from .versions import restore  # lazy: numpy, for dsc --help's speed

    if (version is None) == (tag_name is None):
        raise click.UsageError("give --version N or --tag NAME (one of them, not both)")
    n = restore(dataset, version, tag_name)
    click.echo(f"version {n} of {dataset} restores " + (f"version {version}" if tag_name is None else f"tag {tag_name}"))


@main.command(name="compact")
@click.argument("dataset", type=DATASET)
@click.option("--quiet", "-q", is_flag=True, help="Print nothing but errors.")
def compact_cmd(dataset: Path, quiet: bool):
    """Rewrite the latest version of the local DATASET into storage order, as a new version: after several
    `--update`s its samples are scattered over many shards (order="quasi_random" then reads many per batch).

    Nothing is decoded: every sample keeps its bytes, label, boxes, mask and key, and ds[i] is the same sample.
    The old version stays until `dsc vacuum` removes it."""
    from .compiler.compact import compact_dataset  # lazy: PIL, for the compile commands

    r = compact_dataset(dataset, info=None if quiet else click.echo, warn=lambda m: click.echo(f"warning: {m}", err=True))
    if quiet:
        return
    if not r.committed:
        click.echo(f"version {r.version} of {dataset} is in storage order already; nothing to do")
        return
    m = r.manifest
    click.echo(f"version {r.version} of {dataset}: {_n(m.num_samples, 'sample')} in {_n(m.shard_count, 'shard')} "
               f"({_mb(r.bytes_written)} copied, nothing decoded) in {r.seconds:.1f} s; version {r.version - 1} stays "
               f"until `dsc vacuum` removes it")


@main.command(name="vacuum")
@click.argument("dataset", type=DATASET)
@click.option("--keep", type=click.IntRange(min=1), default=1, show_default=True,
              help="Keep the newest K versions (tagged versions are always kept).")
@click.option("--older-than", default="7d", show_default=True, metavar="DURATION",
              help="Only remove versions superseded at least this long ago (7d, 12h, 30m, 0): a reader on "
                   "another machine may still have them open.")
@click.option("--dry-run", is_flag=True, help="Print what would be removed; remove nothing.")
def vacuum_cmd(dataset: Path, keep: int, older_than: str, dry_run: bool):
    """Remove old versions of DATASET (a folder or an s3:// gs:// az:// URL) and every file no remaining version
    uses.

    A version is kept when it is among the newest K, tagged, open in a reader (a folder: a process on this
    machine holds its pin; a URL: a reader holds a lease on it, until it closes or the lease expires), or
    superseded less than --older-than ago. In object storage, files no version references (an interrupted
    or losing writer's) are removed once older than --older-than, and vacuum does not run beside a writer."""
    from .versions import vacuum  # lazy: numpy, for dsc --help's speed

    from .store import is_url  # lazy: numpy, for dsc --help's speed

    r = vacuum(dataset, keep=keep, older_than=older_than, dry_run=dry_run)
    verb = "would remove" if dry_run else "removed"
    click.echo(f"{verb} {_n(len(r.removed), 'version')}" + (f" ({', '.join(map(str, r.removed))})" if r.removed else "")
               + f" and {_n(r.files, 'file')} ({r.bytes:,} bytes, {_mb(r.bytes)})"
               + (f"; kept {'versions' if len(r.kept) > 1 else 'version'} {', '.join(map(str, r.kept))}"
                  if r.kept else ""))
    tagged = [n for n in r.kept if n not in r.pinned and n not in r.recent and n in r.tagged]
    if tagged:
        click.echo(f"kept because tagged: {', '.join(map(str, tagged))}")
    if r.pinned:
        what = "open in a running process" if not is_url(dataset) else \
            "a reader holds a lease on it (_dsc/leases/; one that died expires 7 days after it opened)"
        click.echo(f"kept because {what}: {', '.join(map(str, r.pinned))}")
    if r.recent:
        click.echo(f"kept because superseded less than {older_than} ago: {', '.join(map(str, r.recent))} "
                   f"(--older-than 0 removes them)")
    if r.leftovers:
        click.echo(f"{_n(r.leftovers, 'file')} of those no version referenced (an interrupted or losing writer's)")
    if r.young:
        click.echo(f"kept {_n(r.young, 'file')} no version references, younger than {older_than} (a writer may "
                   f"be about to commit them; --older-than 0 removes them once no writer runs)")


# dsc.transforms.presets.RECIPES (named here so the CLI starts without importing torch; a test compares them)
BENCH_RECIPES = ["imagenet", "ra", "ta_wide", "augmix", "autoaugment", "det-hflip", "det-lsj", "det-multiscale",
                 "det-ssd", "det-ssdlite", "segmentation", "yolo"]

@main.command(name="bench")
@click.argument("dataset", type=DATASET)
@click.option("--batch-size", type=click.IntRange(min=1), default=256, show_default=True)
@click.option("--order", type=click.Choice(["sequential", "random", "quasi_random"]), default="random",
              show_default=True)
@click.option("--threads", type=click.IntRange(min=1), default=2, show_default=True, help="Loader threads.")
@click.option("--prefetch", type=click.IntRange(min=1), default=3, show_default=True)
@click.option("--epochs", type=click.IntRange(min=1), default=3, show_default=True, help="Timed epochs (best is kept).")
@click.option("--recipe", type=click.Choice(BENCH_RECIPES), default=None,
              help="Time a training recipe (imagenet: RandomResizedCrop(224), flip, ToFloat, Normalize; ra, ta_wide, "
                   "augmix, autoaugment: torchvision's classification presets with RandomErasing 0.1, MixUp 0.2, "
                   "CutMix 1.0; det-hflip, det-lsj, det-multiscale, det-ssd, det-ssdlite: its detection presets; "
                   "segmentation; yolo: Ultralytics' Mosaic + affine + HSV + flip) beside plain epochs and a torch "
                   "DataLoader (2 workers) doing it per image from the source JPEGs.")
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True,
              help="cuda: host-to-device GB/s beside the pinned-copy limit, and how much the copies overlap a "
                   "consumer busy on the GPU.")
@click.option("--quiet", "-q", is_flag=True, help="The figures only (no header line).")
def bench_cmd(dataset: Path, batch_size: int, order: str, threads: int, prefetch: int, epochs: int, recipe,
              device: str, quiet: bool = False):
    """Loader images/s and GB/s beside the machine's copy limit and a PIL-decoding DataLoader."""
    from .bench import run_bench, run_recipe_bench  # lazy: torch, for dsc bench

    def echo(line: str) -> None:
        if not (quiet and line.startswith("dsc bench ")):
            click.echo(line)

    if recipe:
        run_recipe_bench(dataset, recipe, batch_size=batch_size, order=order, num_threads=threads, epochs=epochs,
                         device=device, echo=echo)
        return
    run_bench(dataset, batch_size=batch_size, order=order, num_threads=threads, prefetch=prefetch,
              epochs=epochs, echo=echo, device=device)


@main.command(name="preview")
@click.argument("dataset", type=DATASET)
@click.option("-o", "--output", type=click.Path(path_type=Path, dir_okay=False), default=Path("preview.png"),
              show_default=True, help="PNG to write.")
@click.option("--n", "n", type=click.IntRange(min=1), default=16, show_default=True, help="Number of samples.")
@click.option("--cols", type=click.IntRange(min=1), default=None, help="Grid columns (default: square).")
@click.option("--cell", type=click.IntRange(min=16), default=256, show_default=True, help="Cell size in pixels.")
@click.option("--seed", type=int, default=None,
              help="Draw N random samples with this seed (default: the first N, often all of one class).")
def preview_cmd(dataset: Path, output: Path, n: int, cols, cell: int, seed):
    """Draw a grid of samples with boxes and class names (detection) or class names (classification)."""
    from .runtime import open as open_dataset  # lazy: torch, for the read commands
    from .runtime.preview import preview  # lazy: torch, for the read commands

    path = preview(open_dataset(dataset), output, n=n, cols=cols, cell=cell, seed=seed)
    click.echo(f"wrote {path}")


@main.command(name="push")
@click.argument("local", type=click.Path(path_type=Path, file_okay=False, exists=True))
@click.argument("url")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar.")
@click.option("--force", is_flag=True, help="Move a tag the bucket has on a later version back to this copy's.")
def push_cmd(local: Path, url: str, quiet: bool, force: bool):
    """Publish the compiled dataset LOCAL (every version it keeps, its tags) at URL (s3://, gs://, az://).

    Shards and arrays go first, each version record last by a conditional put; rerunning an interrupted push
    skips what the bucket already has (same size and SHA-256). A tag the bucket has on a later version is
    not moved back without --force."""
    from .compiler.upload import push  # lazy: PIL, for the compile commands

    r = push(local, url, progress=not quiet, force=force)
    click.echo(f"pushed {_n(r['versions'], 'version')} of {local} to {url}: {_n(r['sent'], 'file')} uploaded "
               f"({_mb(r['bytes_sent'])}; shards, arrays and metadata), {r['kept']:,} were there already")


@main.group(name="cache", cls=DscGroup)
def cache_group():
    """The local shard cache of datasets in object storage ($DSC_CACHE_DIR, else $XDG_CACHE_HOME/dsc, else
    ~/.cache/dsc)."""


_cache_dir_option = click.option("--cache-dir", type=click.Path(path_type=Path, file_okay=False), default=None,
                                 help="The cache directory (default: $DSC_CACHE_DIR, else $XDG_CACHE_HOME/dsc, else "
                                      "~/.cache/dsc).")


def _cache_exists(cache_dir) -> None:
    from .store import default_cache_dir  # lazy: numpy, for dsc --help's speed

    where = Path(cache_dir) if cache_dir else default_cache_dir()
    if not where.is_dir():
        raise click.ClickException(f"there is no cache at {where} (nothing was downloaded there yet)")


@cache_group.command(name="warm")
@click.argument("url")
@_cache_dir_option
@click.option("--cache-limit", default=None, metavar="SIZE", help="Bound the cache (200GB, 512MiB, bytes).")
@click.option("--version", "version", type=click.IntRange(min=0), default=None, help="This version (default: latest).")
@click.option("--tag", "tag_name", default=None, help="The tagged version.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar.")
def cache_warm_cmd(url: str, cache_dir, cache_limit, version, tag_name, quiet: bool):
    """Download URL's shards into the cache before training (as many as --cache-limit holds)."""
    from .runtime.remote import warm  # lazy: torch, for the read commands

    r = warm(url, cache_dir, cache_limit, version, tag_name, progress=not quiet)
    click.echo(f"{url}: {_n(r['downloaded'], 'shard')} downloaded ({_mb(r['bytes'])}), "
               f"{_n(r['cached'], 'was', 'were')} cached already, {r['shards']:,} in all")
    if r["left_out"]:
        click.echo(f"warning: {r['left_out']:,} shards were not warmed: they do not fit in --cache-limit "
                   f"{cache_limit} (training downloads them when it needs them)", err=True)


@cache_group.command(name="ls")
@_cache_dir_option
@click.option("--json", "as_json", is_flag=True, help="Print as JSON.")
def cache_ls_cmd(cache_dir, as_json: bool):
    """What the cache holds: each dataset's URL, versions read, shards cached; the bytes in all."""
    from .runtime.remote import cache_list  # lazy: torch, for the read commands
    from .store import default_cache_dir  # lazy: numpy, for dsc --help's speed

    where = Path(cache_dir) if cache_dir else default_cache_dir()
    r = cache_list(cache_dir) if where.is_dir() else {"root": str(where), "bytes": 0, "files": 0, "datasets": []}
    if as_json:
        click.echo(json.dumps(r, indent=2))
        return
    if not where.is_dir():  # (an empty listing, not an error: nothing was downloaded there yet)
        click.echo(f"{where}: empty (no cache there yet: `dsc cache warm URL` or opening a URL fills it)")
        return
    click.echo(f"{r['root']}: {_mb(r['bytes'])} in {_n(r['files'], 'shard file')}")
    for d in r["datasets"]:
        click.echo(f"  {d['url']}  versions {','.join(map(str, d['versions'])) or '-'}  "
                   f"{d['cached']:,}/{d['shards']:,} shards cached ({_mb(d['bytes'])})")


@cache_group.command(name="verify")
@_cache_dir_option
def cache_verify_cmd(cache_dir):
    """Re-hash every cached shard and small file; delete the damaged ones (they are downloaded again when needed)."""
    from .runtime.remote import cache_check  # lazy: torch, for the read commands

    _cache_exists(cache_dir)
    checked, bad = cache_check(cache_dir)
    if bad:
        raise click.ClickException(f"{bad:,} of {checked:,} cached files (shards and small files) were damaged on "
                                   f"this disk and were deleted; they are downloaded again when needed")
    click.echo(f"OK: {checked:,} cached files (shards and small files) match their SHA-256")


@cache_group.command(name="clear")
@click.argument("url", required=False)
@_cache_dir_option
def cache_clear_cmd(url, cache_dir):
    """Delete cached shards (all, or URL's) that no running process is reading."""
    from .runtime.remote import cache_clear  # lazy: torch, for the read commands

    _cache_exists(cache_dir)
    removed, freed, kept = cache_clear(cache_dir, url)
    click.echo(f"removed {_n(removed, 'shard file')} ({_mb(freed)})"
               + (f"; kept {kept:,} in use by running processes" if kept else ""))


@main.command()
@click.argument("dataset", required=False, type=DATASET, metavar="DATASET")  # (not [DATASET]: only --env goes without)
@click.option("--env", "show_env", is_flag=True, help="Show the software dsc runs on (PIL build, libjpeg, torch).")
@click.option("--skipped", is_flag=True, help="List every input left out at compile time, with the reason.")
@click.option("--json", "as_json", is_flag=True, help="Print the manifest (or environment) as JSON.")
@click.option("--version", "version", type=click.IntRange(min=0), default=None,
              help="Describe this version (default: the latest).")
@click.option("--quiet", "-q", is_flag=True, help="The dataset's own rows only (not the reader's build, nor how "
                                                  "dsc.Loader would read it here); no notes.")
def info(dataset: Path | None, show_env: bool, skipped: bool, as_json: bool, version, quiet: bool = False):
    """Describe a compiled DATASET (a folder or an s3:// gs:// az:// URL): schema, counts, bytes, classes,
    shards, the dsc + PIL build, and how dsc.Loader would read it here (`reads`: the dataset's size against
    the memory available now, the cgroup's limit included; $DSC_MEMORY overrides that figure).
    `dsc info --env` without DATASET: the software dsc runs on only."""
    from .env import environment, pil_build  # lazy: PIL, for dsc info

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
    from .formats.layout import check_shard_files, shard_specs  # lazy: numpy, for dsc --help's speed
    from .versions import manifest_of  # lazy: numpy, for dsc --help's speed

    m, versions_line = manifest_of(dataset, version)
    if as_json:
        click.echo(json.dumps(m.to_dict(), indent=2, ensure_ascii=False))
        return
    if skipped:
        for s in m.skipped:
            click.echo(f"{s['key']}\t{s['reason']}")
        if not m.skipped and not quiet:
            click.echo("no input was skipped", err=True)
        return
    from .store import is_url  # lazy: numpy, for dsc --help's speed

    remote = is_url(dataset)
    if not remote:
        check_shard_files(dataset, m)
    pil = None if quiet else pil_build()
    total = sum(s.nbytes for s in shard_specs(m))
    cls = ", ".join(m.classes[:12]) + (", ..." if len(m.classes) > 12 else "")
    rows = [
        ("dataset", str(dataset)),
        ("format", f"dsc format v{m.format_version} (Zarr v3 group), written by dsc {m.dsc_version}"),
        ("task", m.task),
        *([("version", versions_line)] if versions_line else []),
        ("samples", f"{m.num_samples:,} in {_n(m.shard_count, 'shard')} of up to {m.shard_size}"
                    + (f"; {m.num_rows:,} rows ({m.num_rows - m.num_samples:,} not live: removed samples and holes, "
                       f"which plain Zarr readers see with live == False)" if m.versioned and m.num_rows != m.num_samples
                       else "")),
        ("image", _describe_image(m)),
        ("bytes", f"{_mb(total)} of shards " + ("(in object storage; `dsc cache ls` shows what is cached here)"
                                                 if remote else "(all present, sizes match the manifest)")),
        ("classes", f"{len(m.classes)}: {cls}" if m.classes else "none"),
        *([("objects", _describe_objects(m, dataset, version))] if m.objects is not None else []),
        *_extra_fields(m),
        ("source", " ".join(f"{k}={v}" for k, v in m.source.items() if k not in ("options", "params"))),
        ("skipped", f"{len(m.skipped)}" + (" (dsc info --skipped lists them)" if m.skipped else "")),
        *([] if quiet else [
            ("reader", f"dsc {__version__} on {pil['pil_distribution']} {pil['pil_version']}"
                       f" (libjpeg-turbo {pil['libjpeg_turbo']})"),
            ("reads", _reads_line(total))]),
    ]
    for k, v in rows:
        click.echo(f"{k:10}{v}")


def _reads_line(total: int) -> str:
    from .runtime.reads import describe  # lazy: torch, for the read commands

    try:
        return f"{describe(total)} (dsc.Loader(read=...) forces one)"
    except DscError as e:
        return f"unknown: {e}"


if __name__ == "__main__":  # pragma: no cover
    main()
