"""Object storage through obstore (Rust's ``object_store``): ``s3://``, ``gs://``, ``az://`` (docs/REMOTE.md).

One library for every cloud: on the same local S3 server it streamed shards about 1.7x faster than s3fs,
it has the conditional put (If-None-Match) a version commit needs, and it has no async stack to pin.
Credentials, endpoints and regions come from each cloud's standard variables (``AWS_*``, ``GOOGLE_*``,
``AZURE_*``) and, for S3, from ``~/.aws/credentials`` and ``~/.aws/config`` (``AWS_PROFILE``).

Faults: requests are retried with exponential backoff and full jitter (obstore's own retries for each
request, and one more loop around whole operations such as a streamed download) until ``retry_seconds``
have passed; then :class:`~dsc.errors.RemoteError` names the URL and the last cause.
"""
from __future__ import annotations

import configparser
import io
import mmap
import os
import random
import re
import threading
import time
from datetime import timedelta
from pathlib import Path

from ..errors import CompileLockedError, ConfigError, CorruptDatasetError, CredentialsError, DscError, RemoteError
from .base import MissingFile, SeekableFile, Store, object_changed
from .local import pid_alive as _alive
from ..errors import DatasetNotFoundError

FAMILY = {"s3": "s3", "s3a": "s3", "gs": "gs", "gcs": "gs", "az": "az", "azure": "az", "abfs": "az", "abfss": "az",
          "adl": "az"}  # the URL schemes obstore speaks, each to its service
DEFAULT_RETRY_SECONDS = 120.0
CREDENTIAL_HINTS = {
    "s3": "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE naming a profile of ~/.aws/credentials); "
          "for an S3-compatible server also AWS_ENDPOINT_URL",
    "gs": "set GOOGLE_APPLICATION_CREDENTIALS (or GOOGLE_SERVICE_ACCOUNT) to a service-account key file",
    "az": "set AZURE_STORAGE_ACCOUNT_NAME and AZURE_STORAGE_ACCOUNT_KEY (or AZURE_STORAGE_SAS_KEY)",
}



def retry_seconds(value: float | None = None) -> float:
    """The retry budget: ``value``, else ``$DSC_RETRY_SECONDS``, else 120 s."""
    if value is None:
        env = os.environ.get("DSC_RETRY_SECONDS")
        try:
            value = float(env) if env else DEFAULT_RETRY_SECONDS
        except ValueError:
            raise ConfigError(f"DSC_RETRY_SECONDS={env!r} is not a number of seconds") from None
    if not isinstance(value, (int, float)) or value < 0:
        raise ConfigError(f"retry_seconds must be a non-negative number, got {value!r}")
    return float(value)

def aws_files_config(env=os.environ) -> dict:
    """S3 settings from the AWS config files when the environment does not give them: the profile
    ``AWS_PROFILE`` (or ``default``) of ``AWS_SHARED_CREDENTIALS_FILE`` (~/.aws/credentials) and of
    ``AWS_CONFIG_FILE`` (~/.aws/config). Environment variables win (obstore reads them itself)."""
    out: dict = {}
    profile = env.get("AWS_PROFILE") or env.get("AWS_DEFAULT_PROFILE") or "default"
    home = Path(env.get("HOME") or Path.home())
    cred_file = Path(env.get("AWS_SHARED_CREDENTIALS_FILE") or home / ".aws" / "credentials")
    conf_file = Path(env.get("AWS_CONFIG_FILE") or home / ".aws" / "config")
    if "AWS_ACCESS_KEY_ID" not in env and cred_file.is_file():
        cp = configparser.ConfigParser()
        try:
            cp.read(cred_file)
        except configparser.Error as e:
            raise ConfigError(f"{cred_file}: not a valid AWS credentials file ({e})") from None
        if cp.has_section(profile):
            sec = cp[profile]
            for key, name in (("aws_access_key_id", "access_key_id"), ("aws_secret_access_key", "secret_access_key"),
                              ("aws_session_token", "token")):
                if sec.get(key):
                    out[name] = sec[key]
    if conf_file.is_file():
        cp = configparser.ConfigParser()
        try:
            cp.read(conf_file)
        except configparser.Error as e:
            raise ConfigError(f"{conf_file}: not a valid AWS config file ({e})") from None
        section = "default" if profile == "default" else f"profile {profile}"
        if cp.has_section(section):
            sec = cp[section]
            if sec.get("region") and not (env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION")):
                out["region"] = sec["region"]
            if sec.get("endpoint_url") and not env.get("AWS_ENDPOINT_URL"):
                out["endpoint"] = sec["endpoint_url"]
            for key, name in (("aws_access_key_id", "access_key_id"), ("aws_secret_access_key", "secret_access_key")):
                if sec.get(key) and name not in out and "AWS_ACCESS_KEY_ID" not in env:
                    out[name] = sec[key]
    return out


def storage_options(url: str) -> dict:
    """The settings dsc's client for ``url`` uses (the environment's and, for S3, the AWS files'), as the
    ``storage_options`` of other object_store-based readers (deltalake): the same credentials and endpoint."""
    scheme = FAMILY.get(url.split("://", 1)[0].lower())
    if scheme != "s3":
        return {}  # (GCS and Azure: those readers take the same GOOGLE_* / AZURE_* variables themselves)
    config = aws_files_config()
    names = {"access_key_id": "AWS_ACCESS_KEY_ID", "secret_access_key": "AWS_SECRET_ACCESS_KEY",
             "token": "AWS_SESSION_TOKEN", "region": "AWS_REGION", "endpoint": "AWS_ENDPOINT_URL"}
    out = {names[k]: v for k, v in config.items() if k in names}
    for var in ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"):
        if os.environ.get(var) and "AWS_ENDPOINT_URL" not in out:
            out["AWS_ENDPOINT_URL"] = os.environ[var]
    if not (os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "AWS_REGION" in out):
        out["AWS_REGION"] = "us-east-1"  # (as ObjectStore: an S3-compatible server ignores it)
    if out.get("AWS_ENDPOINT_URL", "").startswith("http://"):
        out["AWS_ALLOW_HTTP"] = "true"
    return out


def upload_checks(env=os.environ) -> dict:
    """How an S3 put's body is checked on its way into the bucket (docs/REMOTE.md): a CRC64-NVME checksum header
    (``x-amz-checksum-crc64nvme``: S3 verifies it against the bytes it received and refuses the put on a
    mismatch), and a SigV4 signature that does not hash the body (``UNSIGNED-PAYLOAD``, as the AWS CLI signs over
    HTTPS), over plain http too, where SigV4's SHA-256 of the body was the only check and cost the client a
    second pass over every shard (150 MB of PUTs: 0.1 client CPU s; the CRC about 0.015 s). dsc hashed each
    shard as it wrote it; that SHA-256 travels in the object's metadata, and readers check it.
    ``AWS_CHECKSUM_ALGORITHM`` (``sha256``, for a server that refuses CRC64-NVME) and ``AWS_UNSIGNED_PAYLOAD``
    (``false``: hash the body to sign it) set by the user win: obstore reads them itself."""
    out: dict = {}
    if "AWS_UNSIGNED_PAYLOAD" not in env:
        out["unsigned_payload"] = True
    if "AWS_CHECKSUM_ALGORITHM" not in env:
        out["checksum_algorithm"] = "crc64nvme"
    return out


_MISMATCH = re.compile(r"(?i)(BadDigest|XAmzContentChecksumMismatch|did not match)")  # a body damaged in transit
_TRANSIENT = re.compile(r"(?i)(connect|connection|timed? ?out|timeout|reset|broken pipe|temporar|throttl|slow ?down|"
                        r"too many requests|service unavailable|internal ?error|bad gateway|gateway|\b5\d\d\b|"
                        r"retry|dns|eof|incomplete|body|sending request|http error)")


_USED_BY: int | None = None  # the process that made the first request: obstore cannot make requests after a fork
# a ranged GET answered without its range (obstore's words): the whole object (an empty one), or no Content-Range
_NO_RANGE = re.compile(r"non-partial response|content[-_]range", re.IGNORECASE)
_STATUS = re.compile(r"(?:status code|status)[: ]+(\d{3})\b", re.IGNORECASE)


class ObjectStore(Store):
    """S3 / GCS / Azure through obstore."""

    def __init__(self, url: str, retry: float = DEFAULT_RETRY_SECONDS):
        try:
            import obstore  # noqa: F401
            from obstore.store import from_url
        except ImportError:
            raise ConfigError(f"{url}: remote datasets need obstore: pip install 'dsc[remote]'") from None
        self.url = url.rstrip("/")
        self.scheme = FAMILY[url.split("://", 1)[0].lower()]
        self.retry = retry
        self._warned = 0.0
        config: dict = {}
        if self.scheme == "s3":
            config.update(aws_files_config())
        self.endpoint = (config.get("endpoint") or os.environ.get("AWS_ENDPOINT_URL_S3")
                         or os.environ.get("AWS_ENDPOINT_URL")) if self.scheme == "s3" else None
        client = {"allow_http": True} if (self.endpoint or "").startswith("http://") else {}
        if self.scheme == "s3":
            config.update(upload_checks(os.environ))
        if self.scheme == "s3" and "region" not in config and not (os.environ.get("AWS_REGION")
                                                                  or os.environ.get("AWS_DEFAULT_REGION")):
            config["region"] = "us-east-1"  # (an S3-compatible server ignores it; AWS redirects per bucket)
        # obstore retries each request briefly (a call into it cannot be interrupted by Ctrl-C); the retry budget
        # is spent in dsc's own loop, whose sleeps can.
        retry_config = {"max_retries": 3, "retry_timeout": timedelta(seconds=max(min(retry, 5.0), 0.001)),
                        "backoff": {"init_backoff": timedelta(milliseconds=100), "max_backoff": timedelta(seconds=2),
                                    "base": 2}}
        try:
            self._store = from_url(self.url, config=config or None, client_options=client or None,
                                   retry_config=retry_config)
        except Exception as e:  # bad URL or settings: obstore's own message says which
            raise ConfigError(f"{url}: cannot use this object store: {_first_line(e)}") from None

    # ------------------------------------------------------------------ retries and errors
    def _refused(self, what: str, rel: str, detail: str) -> CredentialsError:
        return CredentialsError(f"{self.where(rel)}: {what} refused ({detail}); "
                                f"{CREDENTIAL_HINTS.get(self.scheme, 'check the credentials')}")

    def _call(self, what: str, rel: str, fn, budget: float | None = None):
        """``fn()`` with retries of transient failures until the budget (``retry_seconds``, or ``budget``) is
        spent; errors become dsc's."""
        import obstore.exceptions as E

        global _USED_BY
        if _USED_BY is None:
            _USED_BY = os.getpid()
        if os.getpid() != _USED_BY:
            raise ConfigError(
                f"{self.where(rel)}: this process was forked from one that had already used object storage, and the "
                f"client library (obstore) cannot make requests after a fork. Use dsc.Loader (threads), or a "
                f"DataLoader with multiprocessing_context='spawn' (or 'forkserver'), or download the shards first "
                f"(dsc cache warm URL): a forked worker reads cached shards without a request")
        deadline = time.monotonic() + (self.retry if budget is None else budget)
        attempt = 0
        while True:
            try:
                return fn()
            except (E.NotFoundError, FileNotFoundError):
                raise MissingFile(f"{self.where(rel)} is missing") from None
            except (E.PermissionDeniedError, E.UnauthenticatedError) as e:
                raise self._refused(what, rel, _first_line(e)) from None
            except (E.AlreadyExistsError, E.PreconditionError):
                raise FileExistsError(self.where(rel)) from None
            except DscError:
                raise
            except Exception as e:  # noqa: BLE001 - anything else from the network: retry while budget is left
                attempt += 1
                status = _STATUS.search(str(e))
                code = int(status.group(1)) if status else None
                if code in (401, 403):
                    raise self._refused(what, rel, f"{code}: {_first_line(e)}") from None
                if code == 404:
                    raise MissingFile(f"{self.where(rel)} is missing") from None
                mismatch = bool(_MISMATCH.search(str(e)))
                if code is not None:  # (a body damaged on its way in, refused by its checksum: sent again)
                    transient = (code >= 500 and code != 501) or code in (408, 429) or (code == 400 and mismatch)
                else:
                    transient = isinstance(e, (OSError, TimeoutError)) or bool(_TRANSIENT.search(str(e)))
                left = deadline - time.monotonic()
                if not transient or left <= 0:
                    hint = ("; for an S3-compatible server set AWS_ENDPOINT_URL" if self.scheme == "s3" and
                            not self.endpoint else "")
                    text = str(e).lower()
                    if self.scheme == "s3" and (code == 501 or (code == 400 and ("checksum" in text or
                                                                                 "notimplemented" in text))):
                        hint += ("; a server that does not take CRC64-NVME checksums needs "
                                 "AWS_CHECKSUM_ALGORITHM=sha256 (and AWS_UNSIGNED_PAYLOAD=false)")
                    raise RemoteError(f"{self.where(rel)}: {what} failed"
                                      + (f" after {attempt} attempts over {self.retry:.0f} s" if transient else "")
                                      + f": {_first_line(e)}. Check the URL, the network and the server{hint}"
                                      + (" (DSC_RETRY_SECONDS sets how long dsc retries)" if transient else "")) \
                        from None
                if time.monotonic() - self._warned > 60:  # say once a minute that dsc is waiting, not hung
                    self._warned = time.monotonic()
                    import warnings

                    warnings.warn(f"{self.where(rel)}: {what} failed ({_first_line(e)[:120]}); retrying for up to "
                                  f"{left:.0f} s more (DSC_RETRY_SECONDS sets how long; Ctrl-C stops)", RuntimeWarning, stacklevel=3)
                time.sleep(min(left, random.uniform(0, min(5.0, 0.1 * 2 ** min(attempt, 10)))))  # full jitter

    # ------------------------------------------------------------------ operations
    def download(self, rel: str, f, on_chunk=None, limit: int | None = None) -> int:
        """Stream the object into the open binary file ``f`` from its start (a failed attempt starts over), then
        cut ``f`` to the bytes written; ``f`` is never made shorter before that (a cache counts its
        pre-allocated size). ``on_chunk`` sees every chunk, and ``None`` whenever an attempt starts (a hash
        starts over then)."""
        import obstore

        def attempt():
            f.seek(0)
            if on_chunk is not None:
                on_chunk(None)
            n = 0
            for chunk in obstore.get(self._store, rel).stream(min_chunk_size=1 << 21):
                mv = memoryview(chunk)
                if limit is not None and n + len(mv) > limit:  # (never more than the manifest says on disk)
                    raise CorruptDatasetError(f"{self.where(rel)} has more than the {limit:,} bytes it may have; the "
                                              f"dataset in object storage is damaged or was replaced. Recompile it "
                                              f"(dsc verify URL lists every damaged file)")
                f.write(mv)
                if on_chunk is not None:
                    on_chunk(mv)
                n += len(mv)
            f.truncate()
            return n

        return self._call("downloading", rel, attempt)

    def put(self, rel: str, data, create_only: bool = False, attributes: dict | None = None) -> None:
        import obstore
        import obstore.exceptions as E

        def attempt():
            if isinstance(data, (str, os.PathLike)):
                src = Path(data)
            elif isinstance(data, (bytes, bytearray, memoryview, mmap.mmap)):  # (a file's pages: no copy)
                src = data
            else:  # an open binary file: from its start on every attempt
                data.seek(0)
                src = data
            kwargs = {"attributes": attributes} if attributes else {}
            try:
                obstore.put(self._store, rel, src, mode="create" if create_only else "overwrite", **kwargs)
            except E.NotSupportedError:
                if not create_only:
                    raise
                # The store has no conditional put: the documented equivalent (docs/REMOTE.md) is a check, then a
                # put; two writers racing within one request time can both believe they won.
                if obstore.head(self._store, rel) is not None:
                    raise FileExistsError(self.where(rel)) from None
                obstore.put(self._store, rel, src, **kwargs)
        self._call("writing", rel, attempt)

    def read_range(self, rel: str, start: int, end: int):
        """Bytes ``[start, end)`` of the object in one request (fewer at its end), as obstore's buffer (not copied
        into a bytes object: a Parquet row group, a shard's samples)."""
        import obstore

        if end <= start:
            return b""
        return self._call("reading", rel, lambda: obstore.get_range(self._store, rel, start=start, end=end))

    def read_range_pinned(self, rel: str, start: int, end: int, etag: str | None = None):
        """(bytes ``[start, end)`` as obstore's buffer, the object's ETag, its attributes) in one request. With
        ``etag``: sent as If-Match (S3, Azure and GCS refuse a replaced object with 412; a server that ignores it,
        fake-gcs-server, is caught by the answer's ETag), and an object replaced since is an ObjectChangedError."""
        if end <= start:
            return b"", etag, {}
        r = self._call("reading", rel, lambda: self._get(rel, {"range": (start, end)}, etag))
        return r.bytes(), _tag_of(r, etag), dict(r.attributes)

    def _get(self, rel: str, options: dict, etag: str | None):
        """``obstore.get`` of the object, of the one ``etag`` names only (If-Match, then the answer's ETag checked)."""
        import obstore
        import obstore.exceptions as E

        if etag:
            options = {**options, "if_match": _quoted(etag)}
        try:
            r = obstore.get(self._store, rel, options=options)
        except E.PreconditionError:
            raise object_changed(self.where(rel)) from None
        got = r.meta.get("e_tag")
        if etag and got and etag_key(got) != etag_key(etag):
            raise object_changed(self.where(rel))
        return r

    def reader(self, rel: str, size: int, buffer: int = 4 << 20, sequential: bool = False, start: int | None = None,
               ahead: int = 0, etag: str | None = None):
        """The object as a seekable binary file of ``size`` bytes (a size below the object's: it reads as if it
        ended there, and no byte past it is asked for). ``sequential``: read by one streamed GET from where
        reading starts (a tar read member after member: one request, not one per buffer), opened again only
        after a seek backwards or far ahead; else by ranges of ``buffer`` bytes (a Parquet file's footer, then
        its row groups). ``start`` with ``ahead``: the stream opens at ``start`` now, and a thread reads up to
        ``ahead`` bytes ahead of the reader (the network's waits overlap the caller's work). Every request is of
        the object ``etag`` names (a listing's), else of the one the first request read: one replaced in between
        is an ObjectChangedError, never bytes of two versions."""
        if not sequential:
            return super().reader(rel, size, buffer, etag)
        raw = StreamFile(self, rel, size, ahead, etag)
        if start is not None:
            raw.seek(start)
            raw._open()
        return io.BufferedReader(raw, min(buffer, 1 << 20))

    def open_stream(self, rel: str, start: int, end: int | None = None, etag: str | None = None):
        """An iterator of the object's bytes from ``start`` on (one GET), up to ``end`` when given (the server
        then sends no more than is read: a unit that needs part of a tar asks for that part). Fewer bytes where
        the object is shorter; none when it ends before ``start``. Its ``etag``: the object's; with ``etag`` given,
        of that object only (see :meth:`read_range_pinned`)."""

        def attempt():
            opts = {"range": (start, end)} if end is not None else {"range": {"offset": start}} if start else {}
            try:
                r = self._get(rel, opts, etag)
            except DscError:
                raise
            except Exception as e:  # noqa: BLE001 - 416: the object ends before start (cut short since its listing)
                status = _STATUS.search(str(e))
                if status and int(status.group(1)) == 416:
                    return Stream(iter(()), etag)
                raise
            return Stream(iter(r.stream(min_chunk_size=1 << 20)), _tag_of(r, etag))
        return self._call("reading", rel, attempt)

    def open_whole(self, rel: str, buffer: int = 1 << 20):
        """(the object as a sequential seekable file read by one streamed GET from its start, its identity (size,
        last modified, ETag) as that GET's response gives it): a reader that needs the object's size first (a
        tar's scan) asks no HEAD, and the identity is the one of the bytes read. A stream that fails midway is
        opened again where it stopped (as :class:`StreamFile`), of the object this GET read (its ETag as If-Match: a
        tar replaced while the connection was down is an ObjectChangedError, never an image of two versions)."""

        def attempt():
            r = self._get(rel, {}, None)
            m = r.meta
            return ((int(m["size"]), m["last_modified"].timestamp(), str(m.get("e_tag") or "")),
                    iter(r.stream(min_chunk_size=1 << 20)))
        ident, it = self._call("reading", rel, attempt)
        raw = StreamFile(self, rel, ident[0], etag=ident[2] or None)
        raw._it, raw._at = it, 0
        return io.BufferedReader(raw, buffer), ident

    def read_tail(self, rel: str, n: int):
        """(the object's last ``n`` bytes, all of it when smaller, as obstore's buffer; its identity (size, last
        modified, ETag) as that GET's response gives it) in one request: a reader that starts at the end (a Parquet
        footer) needs no HEAD first for the size. Where the store takes no suffix range (Azure Blob), or answers one
        with no partial content (an empty object: 416, or the whole 0 bytes), the Store's way: a HEAD for the size,
        then the range of the object it named. FileNotFoundError when there is no such object."""
        import obstore.exceptions as E

        def attempt():
            try:
                r = self._get(rel, {"range": {"suffix": int(n)}}, None)
            except E.NotSupportedError:
                return None
            except (E.NotFoundError, FileNotFoundError, DscError):
                raise
            except Exception as e:  # noqa: BLE001 - no range in the answer (an empty object has no last bytes)
                status = _STATUS.search(str(e))
                if (status and int(status.group(1)) == 416) or _NO_RANGE.search(str(e)):
                    return None
                raise
            m = r.meta
            return r.bytes(), (int(m["size"]), m["last_modified"].timestamp(), str(m.get("e_tag") or ""))
        got = self._call("reading", rel, attempt)
        return got if got is not None else super().read_tail(rel, n)

    def identity(self, rel: str) -> tuple[int, float, str] | None:
        """(size, last modified as a Unix time, ETag) of the object, or None: what says it changed."""
        import obstore

        try:
            meta = self._call("checking", rel, lambda: obstore.head(self._store, rel))
        except FileNotFoundError:
            return None
        return int(meta["size"]), meta["last_modified"].timestamp(), str(meta.get("e_tag") or "")

    def stat(self, rel: str) -> tuple[int, dict] | None:
        """(size, user metadata such as the ``sha256`` an upload recorded) in one request; None if absent."""
        import obstore

        def attempt():
            r = obstore.get(self._store, rel, options={"head": True})
            return int(r.meta["size"]), dict(r.attributes)

        try:
            return self._call("checking", rel, attempt)
        except FileNotFoundError:
            return None

    def list_detailed(self, prefix: str) -> list[tuple[str, int, float]]:
        return [entry[:3] for entry in self.list_tagged(prefix)]

    def list_tagged(self, prefix: str) -> list[tuple[str, int, float, str]]:
        """(path, size, last modified, ETag) of every object under ``prefix``: a source's inputs, whose identity
        (``identity``) says whether they changed."""
        import obstore

        def attempt():
            return [(o["path"], int(o["size"]), o["last_modified"].timestamp(), str(o.get("e_tag") or ""))
                    for batch in obstore.list(self._store, prefix=prefix or None) for o in batch]

        try:
            return self._call("listing", prefix or "/", attempt)
        except FileNotFoundError:  # listing a missing prefix gives nothing: this is the bucket (container)
            bucket = self.url.split("://", 1)[1].split("/", 1)[0]
            raise DatasetNotFoundError(
                f"{self.url}: the bucket {bucket!r} does not exist" + (f" at {self.endpoint}" if self.endpoint else "")
                + "; check the URL" + (" (and AWS_ENDPOINT_URL for an S3-compatible server)" if self.scheme == "s3"
                                       else "")) from None

    def lock(self, what: str) -> "WriterLease":
        """A writer's lease (see :class:`WriterLease`): no flock in object storage."""
        return WriterLease(self, what)

    def delete(self, rel: str, best_effort: bool = False) -> None:
        """Remove the object; ``best_effort``: one attempt (a lease let go when a reader closes: it expires
        anyway), and no error."""
        import obstore

        try:
            self._call("deleting", rel, lambda: obstore.delete(self._store, rel), budget=0.0 if best_effort else None)
        except FileNotFoundError:
            pass
        except DscError:
            if not best_effort:
                raise


def etag_key(tag: str) -> str:
    """An ETag as compared: without a weak mark (``W/``) and its quotes (a listing gives some servers' unquoted)."""
    tag = tag.strip()
    return (tag[2:] if tag[:2] in ("W/", "w/") else tag).strip('"')


def _quoted(tag: str) -> str:
    return f'"{etag_key(tag)}"'


def _tag_of(r, etag: str | None) -> str | None:
    """The ETag a GET answered with (``etag`` when it gave none)."""
    return r.meta.get("e_tag") or etag


class Stream:
    """An opened GET's chunks, and ``etag``: the object's (what a re-opening must read again)."""

    def __init__(self, it, etag: str | None):
        self._it, self.etag = it, etag

    def __iter__(self):
        return self

    def __next__(self):
        return next(self._it)


class StreamFile(SeekableFile):
    """An object read forward by one streamed GET (see :meth:`ObjectStore.reader`): a seek within the next few
    MiB reads through, a seek elsewhere opens a new stream there; a stream that fails midway is opened again
    where it stopped (the store's retries apply to each opening). Every opening reads the object ``etag`` names,
    else the one the first opening read (a tar replaced between two openings: ObjectChangedError)."""

    SKIP = 4 << 20  # a seek forward by up to this much reads through rather than opening a new stream
    REOPENS = 5

    def __init__(self, store: "ObjectStore", rel: str, size: int, ahead: int = 0, etag: str | None = None):
        self.store, self.rel, self.size, self.etag = store, rel, int(size), etag
        self.name = store.where(rel)
        self.pos = 0  # where the reader is
        self._at = None  # where the open stream is (None: no stream)
        self._it, self._left = None, memoryview(b"")
        self.ahead = ahead  # bytes a thread reads ahead of the reader (0: none, the reader's own reads)

    def _open(self) -> None:
        self._stop_ahead()
        pos = self.pos

        def opened():
            stream = self.store.open_stream(self.rel, pos, self.size, self.etag)
            if self.etag is None:  # (the first opening pins the object)
                self.etag = stream.etag
            return stream
        if self.ahead:  # (the request too is made on the read-ahead thread: opening never waits for the server)
            self._it = ReadAhead(opened, self.ahead)
        else:
            self._it = opened()
        self._left, self._at = memoryview(b""), pos

    def _stop_ahead(self) -> None:
        if isinstance(self._it, ReadAhead):
            self._it.stop()

    def close(self) -> None:
        self._stop_ahead()
        self._it = None
        super().close()

    def _chunk(self) -> memoryview:
        for attempt in range(self.REOPENS + 1):
            try:
                return memoryview(next(self._it))
            except StopIteration:
                return memoryview(b"")
            except DscError:
                raise
            except Exception:  # noqa: BLE001 - the connection failed midway: open again where it stopped
                if attempt == self.REOPENS:
                    raise
                self.pos = self._at
                self._open()
        return memoryview(b"")

    def readinto(self, b) -> int:
        if self.pos >= self.size:
            return 0
        if self._at is None or self.pos < self._at or self.pos > self._at + self.SKIP:
            self._open()
        while self._at < self.pos:  # a short seek forward: read through
            if not self._left:
                self._left = self._chunk()
                if not self._left:
                    return 0
            k = min(len(self._left), self.pos - self._at)
            self._left, self._at = self._left[k:], self._at + k
        if not self._left:
            self._left = self._chunk()
        n = min(len(b), len(self._left))
        b[:n] = self._left[:n]
        self._left = self._left[n:]
        self._at += n
        self.pos = self._at
        return n


class ReadAhead:
    """An iterator of a stream's chunks, read by a thread of its own up to ``limit`` bytes ahead of the consumer
    (the next bytes of a tar arrive while the worker decodes the previous image). ``it``: the stream, or a
    function that opens it (called on the thread). A failure of the stream, or of its opening, reaches the
    consumer where it happened; ``stop()`` ends the thread (at the latest after the chunk it waits for)."""

    def __init__(self, it, limit: int):
        import queue

        self._q: queue.SimpleQueue = queue.SimpleQueue()
        self._cv = threading.Condition()
        self._buffered, self._limit, self._stopped = 0, max(1, int(limit)), False
        self._thread = threading.Thread(target=self._run, args=(it,), name="dsc-read-ahead", daemon=True)
        self._thread.start()

    def _run(self, it) -> None:
        try:
            for chunk in (it() if callable(it) else it):
                with self._cv:
                    while self._buffered >= self._limit and not self._stopped:
                        self._cv.wait()
                    if self._stopped:
                        return
                    self._buffered += len(chunk)
                self._q.put(chunk)
            self._q.put(None)
        except BaseException as e:  # noqa: BLE001 - handed to the consumer, which retries or raises it
            self._q.put(e)

    def __iter__(self):
        return self

    def __next__(self):
        item = self._q.get()
        if item is None:
            self._q.put(None)  # (a second call after the end ends too)
            raise StopIteration
        if isinstance(item, BaseException):
            raise item
        with self._cv:
            self._buffered -= len(item)
            self._cv.notify()
        return item

    def stop(self) -> None:
        with self._cv:
            self._stopped = True
            self._cv.notify()


def _first_line(e: BaseException) -> str:
    s = str(e).strip().splitlines()
    return (s[0] if s else type(e).__name__)[:300]


WRITER_LEASE_SECONDS = 12 * 3600.0


class WriterLease:
    """A writer of a dataset in object storage (``ObjectStore.lock``), where there is no flock: the object
    ``_dsc/writers/<id>.json`` (what, process, host, expiry) while it runs. Writers do not exclude each other
    (their files never collide: conditional creates), but a vacuum and a writer do: a vacuum removes nothing
    while another writer's lease is live, and a writer does not start while a vacuum's is. Each puts its lease,
    then lists the others, so of two starting at once at least one sees the other. A writer that died leaves a
    lease that expires after ``WRITER_LEASE_SECONDS``."""

    PREFIX = "_dsc/writers/"

    def __init__(self, store: "ObjectStore", what: str):
        self.store, self.what, self.rel = store, what, None

    def __enter__(self) -> "WriterLease":
        import json
        import secrets
        import socket

        rel = f"{self.PREFIX}{secrets.token_hex(8)}.json"
        now = time.time()
        self.store.put(rel, json.dumps({"what": self.what, "pid": os.getpid(), "host": socket.gethostname(),
                                        "started": now, "expires": now + WRITER_LEASE_SECONDS}).encode())
        self.rel = rel
        for other, info in self.others(now):
            if self.what == "vacuum" or info.get("what") == "vacuum":
                self.__exit__()
                since = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(float(info.get("started", 0))))
                raise CompileLockedError(
                    f"another dsc {info.get('what', 'writer')} (pid {info.get('pid')} on {info.get('host')}, since "
                    f"{since}) is writing {self.store.url}, and a vacuum does not run beside a writer; run it again "
                    f"when that one ends (one that died: its lease {self.store.where(other)} expires "
                    f"{WRITER_LEASE_SECONDS / 3600:.0f} h after it started; delete that object to go on now)")
        return self

    def others(self, now: float):
        """(path, contents) of the other live writers' leases. A lease of a process of this machine that is gone
        (killed) is removed: only writers on other machines wait for their lease to expire."""
        import json
        import socket

        out = []
        for rel, _ in self.store.list(self.PREFIX):
            if rel == self.rel:
                continue
            try:
                info = json.loads(self.store.get(rel, 1 << 12))
                live = float(info["expires"]) > now
            except (ValueError, KeyError, TypeError, DscError, FileNotFoundError):
                continue
            if live and info.get("host") == socket.gethostname() and isinstance(info.get("pid"), int) \
                    and not _alive(info["pid"]):
                self.store.delete(rel, best_effort=True)
                continue
            if live:
                out.append((rel, info))
        return out

    def __exit__(self, *exc) -> None:
        rel, self.rel = self.rel, None
        if rel is not None:
            self.store.delete(rel, best_effort=True)

