"""One error tree. Every dsc error derives from :class:`DscError` and from the built-in it
resembles, so callers can catch what they expect (a missing dataset is also a FileNotFoundError).

Messages name the file concerned and, where there is one, the fix. The CLI prints them as one line.
"""
from __future__ import annotations


class DscError(Exception):
    """Base of every error dsc raises on purpose."""


class ConfigError(DscError, ValueError):
    """A bad argument: a compile option, a Loader or Dataset parameter, a source parameter. Raised where
    the value enters, naming the parameter and what it accepts."""


class SourceError(DscError, ValueError):
    """The input dataset cannot be compiled as given (missing folder, no classes, bad annotation...)."""


class SampleError(SourceError):
    """One input sample cannot be compiled (undecodable image, invalid box...). ``path`` names the
    file (and the annotation), ``reason`` says why. Subject to the compile's ``on_error`` policy."""

    def __init__(self, path: str, reason: str, key: str | None = None, hint: str = ""):
        super().__init__(f"{path}: {reason}{hint}")
        self.path = path
        self.reason = reason
        self.key = key  # the sample's key in the dataset, when known
        self.hint = hint

    def __reduce__(self):  # keep every field across process boundaries
        return (type(self), (self.path, self.reason, self.key, self.hint))


class ImageDecodeError(SampleError):
    """One input image could not be decoded."""


class OutputExistsError(DscError, FileExistsError):
    """The output path exists and ``overwrite`` was not given."""


class CompileLockedError(DscError, BlockingIOError):
    """Another compile is writing the same output right now."""


class ResumeError(ConfigError):
    """``--resume`` found a partial compile of other inputs or options: it cannot be continued (a run without
    ``--resume`` starts over; rerunning with ``--resume`` cannot help)."""


class WriteError(DscError, OSError):
    """Writing the output failed (disk full, file-size limit, permissions). Finished shards are kept:
    free space and rerun the same command with ``--resume``."""

    @classmethod
    def writing(cls, path, e: OSError) -> "DscError":
        """The one message for a failed write of ``path``: the cause as the OS says it, and the fix. A dsc
        error (a link dsc refuses to write through...) is already that message: it is returned as it is."""
        import errno

        if isinstance(e, DscError):
            return e
        full = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
        if e.errno in full:
            fix = "free space (or raise the file-size limit) and rerun the same command with --resume"
        elif e.errno in (errno.EXDEV, errno.EBUSY):
            fix = ("OUT cannot be renamed into place (a mount point, or on another filesystem than its parent "
                   "folder): give OUT as a new folder inside a directory")
        elif e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
            fix = "make the output folder writable and rerun the same command with --resume"
        else:
            fix = "fix the cause and rerun the same command with --resume"
        kept = "; finished shards are kept" if e.errno not in (errno.EXDEV, errno.EBUSY) else ""
        return cls(f"writing {path} failed: {e.strerror or e}{kept}: {fix}")


class DatasetNotFoundError(DscError, FileNotFoundError):
    """The path is not a dsc dataset (no dsc manifest in its zarr.json)."""


class FormatVersionError(DscError, ValueError):
    """The dataset was written by a newer dsc format version than this dsc reads."""


class CorruptDatasetError(DscError, OSError):
    """A dataset file is missing, truncated or inconsistent with the manifest."""


class UnsafePathError(CorruptDatasetError):
    """Dataset metadata names a path outside the dataset; dsc refuses to follow it."""


class VersionNotFoundError(DatasetNotFoundError):
    """The dataset has no such version or tag (never made, or removed by ``dsc vacuum``)."""


class VersionConflictError(DscError, FileExistsError):
    """Another writer committed the version this update was making: nothing of this update was published."""


class RemoteError(DscError, OSError):
    """Object storage failed after retries (the server is unreachable, a shard keeps failing its checksum...).
    The message names the URL and the cause."""


class ObjectChangedError(DscError):
    """An object read in several requests (a tar scanned, then its members read; a shard read by ranges) was
    replaced at its name between them: nothing read from it is used, so no bytes of two versions are mixed. Not
    an ``OSError``: a reader's handling of damage (a tar cut short) does not take it for one. The message names
    the object and the fix (run again: the new object is read from its start)."""


class CredentialsError(RemoteError, PermissionError):
    """Object storage refused the request for lack of (valid) credentials; the message names the variable
    to set."""


class TooManyOpenFilesError(DscError, OSError):
    """The process reached its limit of open files (not damage: raise ``ulimit -n``)."""


class CacheFullError(DscError, OSError):
    """The local shard cache cannot take a shard: its disk is full, or ``cache_limit`` is smaller than what
    the batches in flight need."""
