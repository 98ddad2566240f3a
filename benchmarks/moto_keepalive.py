"""moto's S3 server as a bucket serves: HTTP/1.1 connections kept alive between requests.

``python -m moto.server`` runs on werkzeug's development server, which answers every request with
``Connection: close``, so a client pays a new TCP connection (and over https a new TLS handshake) for every
request. S3 (and GCS, Azure) keep a client's connections open for many requests: a bench that measures the
client's CPU per image against that server would charge it a handshake a request that no real bucket charges.
This runs the same moto application behind a small HTTP/1.1 server of the standard library (a thread a
connection; each request's body read in full by its Content-Length, each response sent with its length), so a
connection serves request after request. ``python moto_keepalive.py PORT [--ssl]``."""
import io
import ssl
import sys
import tempfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import os

# moto keeps an object in a SpooledTemporaryFile that goes to a file on disk past 5 MiB (its default key buffer): each
# shard and tar was written to this machine's disk and read back. In memory, as a bucket's own storage is to it.
os.environ.setdefault("MOTO_S3_DEFAULT_KEY_BUFFER_SIZE", str(1 << 30))

from moto import backends  # noqa: E402
from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app  # noqa: E402

# moto routes every request by listing its own package folder (``backends.list_of_moto_modules``: a listdir and
# about 170 stats), under the application's global lock: 8-12 ms of the server's CPU a request on this machine
# (cProfile of an S3 -> S3 compile: 1.3 s of 19 s), which no bucket spends, and which serialises the requests of
# every connection. The folder does not change while the server runs: listed once.
_MODULES = tuple(backends.list_of_moto_modules())
backends.list_of_moto_modules = lambda: _MODULES


def _bytes_kept_whole() -> None:
    """moto keeps an object in a file-like buffer and reads the whole of it back for every GET, a range of 100 bytes
    included (``FakeKey.value``: a copy of the object, then the range sliced from it): 50-60 ms of the server's CPU
    a GET of a 52 MB Parquet file on this machine, whatever the range, where a bucket's cost is the bytes it sends. Each
    object is kept here as one immutable bytes object, handed out without a copy (a range: the slice of it the
    response sends); its ETag is the MD5 of those bytes (moto's own reads the buffer this no longer fills), and
    ``dispose`` (a key deleted or overwritten) drops them, as moto's closes its buffer."""
    from moto.s3.models import FakeKey
    from moto.utilities.utils import md5_hash

    def get(self) -> bytes:
        return self.__dict__.get("_whole", b"")

    def set_(self, new_value) -> None:
        if isinstance(new_value, str):
            new_value = new_value.encode("utf-8")
        self._whole = bytes(new_value)
        self.contentsize = len(self._whole)

    def etag(self) -> str:
        if self._etag is None:
            self._etag = md5_hash(self.value).hexdigest()
        return f'"{self._etag}"'

    dispose = FakeKey.dispose

    def dispose_whole(self, garbage: bool = False) -> None:  # (moto keeps every key it made in FakeKey.instances: a
        dispose(self, garbage)                              # deleted key's bytes are freed here or never)
        self.__dict__.pop("_whole", None)

    FakeKey.value = property(get, set_)
    FakeKey.etag = property(etag)
    FakeKey.dispose = dispose_whole


_bytes_kept_whole()
APP = DomainDispatcherApplication(create_backend_app)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format, *args):  # (send_response's line: _any writes one with the bytes instead)
        pass

    def _log(self, code: int, n_in: int, n_out: int) -> None:  # (one line a request on stderr: the bench counts
        # them, and the bytes each request sent the server and the server sent back)
        sys.stderr.write(f"{self.address_string()} - - \"{self.requestline}\" {code} HTTP/1.1 "
                         f"conn={self.client_address[1]} in={n_in} out={n_out}\n")  # (conn: the client's port, one a
        #                                                                                 connection: their count)

    def _any(self):
        n = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(n) if n else b""
        path, _, query = self.path.partition("?")
        env = {"REQUEST_METHOD": self.command, "PATH_INFO": path, "QUERY_STRING": query, "SERVER_NAME": "127.0.0.1",
               "SERVER_PORT": str(self.server.server_address[1]), "SERVER_PROTOCOL": "HTTP/1.1",
               "wsgi.input": io.BytesIO(body), "wsgi.errors": sys.stderr, "wsgi.version": (1, 0),
               "wsgi.url_scheme": "https" if TLS else "http", "wsgi.multithread": True, "wsgi.multiprocess": False,
               "wsgi.run_once": False, "CONTENT_LENGTH": str(n), "REMOTE_ADDR": self.client_address[0],
               "wsgi.input_terminated": True}  # (the body is read whole: werkzeug reads it as it is, not again
        #                                        through a length-limited stream in 64 kB pieces into a new buffer)
        if self.headers.get("Content-Type"):
            env["CONTENT_TYPE"] = self.headers["Content-Type"]
        for k, v in self.headers.items():
            key = "HTTP_" + k.upper().replace("-", "_")
            env[key] = f"{env[key]},{v}" if key in env else v
        out = {}

        def start_response(status, headers, exc_info=None):
            out["status"], out["headers"] = status, headers
            return lambda data: None

        result = APP(env, start_response)
        try:
            data = b"".join(result)
        finally:
            getattr(result, "close", lambda: None)()
        code, _, reason = out["status"].partition(" ")
        self.send_response(int(code), reason)
        head = self.command == "HEAD"  # (its length is the object's, as the app says)
        for k, v in out["headers"]:
            if k.lower() not in ("connection", "transfer-encoding") and (head or k.lower() != "content-length"):
                self.send_header(k, v)
        if not head:
            self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)
        self._log(int(code), n, 0 if head else len(data))

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _any


TLS = "--ssl" in sys.argv


def main() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler)
    server.daemon_threads = True
    if TLS:  # (a certificate made up on the spot, as moto's --ssl makes one)
        from werkzeug.serving import generate_adhoc_ssl_pair
        from cryptography.hazmat.primitives import serialization

        cert, key = generate_adhoc_ssl_pair()
        d = tempfile.mkdtemp()
        with open(f"{d}/c.pem", "wb") as f:
            f.write(cert.public_bytes(serialization.Encoding.PEM))
        with open(f"{d}/k.pem", "wb") as f:
            f.write(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL,
                                      serialization.NoEncryption()))
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(f"{d}/c.pem", f"{d}/k.pem")
        server.socket = ctx.wrap_socket(server.socket, server_side=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
