"""Sources -> decode/resize -> shard writers. Imports formats/, never runtime/.

``dsc.compile_<source>(...)`` exists for every registered source (see ``sources/__init__.py``); it is
generated from the source's declared parameters: the required ones first (positionally), then OUT, then
the source's optional parameters and the :class:`CompileOptions` as keywords.
"""
from __future__ import annotations

import functools
import inspect
import json
import os
import warnings
from dataclasses import replace
from pathlib import Path

from ..errors import ConfigError
from ..store import open_store
from ..formats import versions
from ..formats.versions import source_date_epoch
from . import cluster
from .sources import inputs
from .compile import compile_dataset
from .options import CompileOptions, CompileReport
from .sources import (DatasetSource, Param, Record, ScannedSource, Source, get_source,  # noqa: F401
                      register_source, scan_coco, scan_imagefolder, scan_table, scan_voc, scan_yolo)
from .sources import sources as all_sources  # (not `sources`: that name is the subpackage)
from .staging import check_output, history
from .update import update_dataset
from .upload import compile_to_url, update_url


def compile_source(source: Source, out, options: CompileOptions, warn=None, info=None) -> CompileReport:
    """The one compile flow every entry point (Python and CLI) goes through: refuse an existing OUT
    before a possibly long scan, scan, hand the source's warnings to ``warn``, compile (or update: its
    plan goes to ``info``). ``out`` may be a URL (s3://, gs://, az://): see upload.py."""
    source_date_epoch()  # a malformed SOURCE_DATE_EPOCH stops the run now, not at its commit
    store = open_store(out)
    if not store.local:  # object storage: compiled in a local staging folder, published there (upload.py)
        if options.update and versions.versions(store):

            def update_local(stage, name, first_slot, direct=None):  # (messages name the URL, not the staging)
                say = (lambda m: warn(name(m))) if warn is not None else None
                tell = (lambda m: info(name(m))) if info is not None else None
                return update_dataset(_scan(source, say, executor=options.executor, keep=not options.dry_run), stage,
                                      options, source,
                                      warn=say, info=tell, first_slot=first_slot, view_too=False, direct=direct)

            return update_url(update_local, out, options)
        if options.dry_run:
            return _dry_first_compile(out, _scan(source, warn, keep=False), info)

        def compile_local(stage, opts, on_unit, direct=None, uploaded=None):
            return compile_dataset(_scan(source, warn, executor=options.executor), stage,
                                   replace(opts, update=False, dry_run=False), warn=warn, source=source,
                                   on_unit=on_unit, direct=direct, uploaded=uploaded)

        return compile_to_url(compile_local, out, options)
    out = store.path
    update = options.update and (Path(out) / "zarr.json").exists()  # --update of nothing: a first compile
    if not update:
        check_output(out, options.overwrite)
        lost = history(out) if options.overwrite and not options.dry_run else None
        if lost:  # (tags are never vacuumed: dropping them is said, never silent)
            message = (f"--overwrite replaces {out}, and with it every version and tag it holds ({lost}): the new "
                       f"compile is version 0, with no tags")
            warn(message) if warn is not None else warnings.warn(message, stacklevel=2)
    scanned = _scan(source, warn, out, options.executor, keep=not options.dry_run)
    if options.dry_run and not update:
        return _dry_first_compile(out, scanned, info)
    if update:
        return update_dataset(scanned, Path(out), options, source, warn=warn, info=info)
    return compile_dataset(scanned, out, replace(options, update=False, dry_run=False), warn=warn, source=source)


def _dry_first_compile(out, scanned: ScannedSource, info) -> CompileReport:
    """``--update --dry-run`` of an OUT that holds no dataset yet: the plan of a first compile."""
    n = len(scanned.records)
    if info is not None:
        info(f"{out} does not exist yet: --update would compile its {n:,} inputs as version 0")
    return CompileReport(path=out, manifest=None, skipped=(), warnings=scanned.warnings,
                         seconds=0.0, bytes_written=0, plan={"added": n, "removed": 0, "changed": 0, "relabelled": 0,
                                                             "moved": 0, "unchanged": 0, "decoded": n},
                         committed=False, dry_run=True)


def _scan(source: Source, warn, out=None, executor=None, keep: bool = True) -> ScannedSource:
    """The source's records, with its non-path parameters recorded (--update checks them); its warnings
    (and one for a local ``out`` inside the source's folder) go to ``warn``. A source that reads its inputs
    to index them (``index_map``: webdataset's tar headers) does it on the cluster's workers with an
    ``executor``. ``keep`` False (a dry run: no unit will decode): a source that can keep the bytes its scan
    streams past for the units (``keep_images``: webdataset's) keeps none."""
    inputs.forget()  # (what the bucket holds now, not what an earlier compile of this process saw)
    if executor is not None and hasattr(type(source), "index_map"):
        source.index_map = cluster.dask_map(executor)
    if not keep and hasattr(type(source), "keep_images"):
        source.keep_images = False
    try:
        scanned = source.prepare()
    finally:
        for name in ("index_map", "keep_images"):  # (the source travels to the workers: not with a client in it)
            if name in vars(source):
                delattr(source, name)
    inside = _out_inside_source(out, scanned) if out is not None else None
    if inside:
        scanned = replace(scanned, warnings=(*scanned.warnings, inside))
    paths = {p.name for p in source.params if p.type in ("dir", "file", "path")}  # may move; root says where
    params = {k: v for k, v in source.config().items() if k not in paths and _utf8_json(v)}
    scanned = replace(scanned, summary={**scanned.summary, "params": params})
    for w in scanned.warnings:
        if warn is not None:
            warn(w)
    return scanned


def _out_inside_source(out, scanned: ScannedSource) -> str | None:
    """A note when OUT lies inside the source's folder: a dsc dataset is never read as an input, so that
    folder is left out of the classes (or the images) of this and every later scan of the source."""
    root = scanned.root
    if not root or not os.path.isdir(root):
        return None
    root, out = os.path.realpath(root), os.path.realpath(out)
    if out == root or os.path.commonpath([root, out]) != root:
        return None
    rel = Path(os.path.relpath(out, root))
    what = ("the classes" if scanned.task == "classification" and len(rel.parts) == 1 else
            f"the class {rel.parts[0]!r}'s images" if scanned.task == "classification" else "the inputs")
    return (f"OUT {out} is inside the source folder {root}: a dsc dataset is never an input, so {rel.as_posix()} is "
            f"left out of {what} of this and every later compile or --update of {root}; compile into a folder "
            f"outside {root} to keep dataset and source apart")


def _utf8_json(v) -> bool:
    try:
        json.dumps(v, ensure_ascii=False).encode("utf-8")
        return True
    except (TypeError, ValueError):  # (UnicodeEncodeError is a ValueError)
        return False


def options_from(source_name: str, kwargs: dict) -> CompileOptions:
    """CompileOptions from keywords; an unknown keyword is a ConfigError naming what is accepted."""
    known = [n for n in CompileOptions.names() if n != "explicit"]  # (explicit: what the caller gave, set here)
    unknown = sorted(set(kwargs) - set(known))
    if unknown:
        params = [p.name for p in get_source(source_name).params if p.python] if source_name else []
        raise ConfigError(f"unknown option{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}; "
                          + (f"{source_name} takes {', '.join(params)} and " if params else "")
                          + f"the compile options {', '.join(known)}")
    return CompileOptions(**kwargs, explicit=tuple(sorted(kwargs)))


@functools.lru_cache(maxsize=None)
def compile_function(cls: type[Source]):
    """``dsc.compile_<name>``: the required source parameters, OUT, the optional ones (positional too, in
    declaration order), then compile options as keywords."""
    required = [p for p in cls.params if p.python and p.required]
    optional = [p for p in cls.params if p.python and not p.required]
    positional = [p.name for p in required] + ["out"]

    P = inspect.Parameter
    signature = inspect.Signature(
        [P(n, P.POSITIONAL_OR_KEYWORD) for n in positional]
        + [P(p.name, P.POSITIONAL_OR_KEYWORD, default=p.default) for p in optional] + [P("options", P.VAR_KEYWORD)],
        return_annotation=CompileReport)

    def compile_fn(*args, **kwargs) -> CompileReport:
        try:
            bound = signature.bind(*args, **kwargs).arguments
        except TypeError as e:
            raise TypeError(f"compile_{cls.name}{signature}: {e}") from None
        options = bound.pop("options", {})
        out = bound.pop("out")
        return compile_source(cls(**bound), out, options_from(cls.name, options))

    compile_fn.__signature__ = signature
    compile_fn.__name__ = compile_fn.__qualname__ = f"compile_{cls.name}"
    compile_fn.__doc__ = (f"{cls.summary()}\n\nCompile with the {cls.name!r} source into ``out``. Source parameters:\n"
                          + "".join(f"  {p.name}: {p.help}\n" for p in cls.params if p.python)
                          + "Other keywords are CompileOptions fields (size=, resize=, max_side=, workers=, ...).")
    return compile_fn


def compile(source, out, classes=None, fields=None, **options) -> CompileReport:  # noqa: A001 - dsc.compile
    """Compile anything: an ImageFolder directory (str / path), or any map-style dataset or iterable of
    ``(image, target)`` samples (see :mod:`dsc.compiler.sources.dataset`). ``fields``: value fields declared
    instead of inferred, ``{"score": "float32", "emb": ("float16", (768,))}``. Keywords: CompileOptions."""
    if isinstance(source, (str, os.PathLike)):
        if fields is not None:
            raise ConfigError("fields= declares a Python dataset's value fields; a folder has none")
        return compile_function(get_source("imagefolder"))(source, out, **options)
    return compile_source(DatasetSource(dataset=source, classes=classes, fields=fields), out,
                          options_from("dataset", options))


def __getattr__(name: str):
    if name.startswith("compile_") and name[8:] in all_sources():
        return compile_function(get_source(name[8:]))
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["compile", "compile_source", "compile_function", "CompileOptions", "CompileReport", "Record",
           "ScannedSource", "Source", "Param", "check_output", "compile_dataset", "get_source", "options_from",
           "register_source", "scan_imagefolder", "all_sources"]
