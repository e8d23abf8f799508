"""Remote data for the tests, on loopback: a real S3-compatible server (moto's server mode)
behind a proxy that can inject faults, and a plain HTTP file server with Range, HEAD, ETag and
If-Match, through the same faults.

    python object_server.py FILES_DIR

prints one JSON line {"s3": "http://127.0.0.1:P", "http": "http://127.0.0.1:P/files"} and serves
until its standard input closes. The proxy's own routes:
    GET  /__log__      every request since the start: [method, path, range] (JSON)
    POST /__faults__   JSON {"503": {"SUBSTRING": N}, "cut": {"SUBSTRING": N}, "deny": "BUCKET"}:
                       the next N GETs of a path holding SUBSTRING answer 503 (S3's SlowDown), or
                       send their headers and half the body, then drop the connection; every
                       request for BUCKET answers 403 AccessDenied.
"""
import email.utils
import hashlib
import http.client
import http.server
import json
import logging
import os
import socket
import sys
import threading

from moto.server import ThreadedMotoServer

FILES = os.path.abspath(sys.argv[1])
LOCK = threading.Lock()
LOG = []
FAULTS = {"503": {}, "cut": {}, "deny": None}


def take_fault(kind, path):
    with LOCK:
        for sub, n in FAULTS[kind].items():
            if n > 0 and sub in path:
                FAULTS[kind][sub] = n - 1
                return True
    return False


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def answer(self, status, body=b"", headers=(), length=None):
        self.send_response(status)
        for k, v in headers:
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body) if length is None else length))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def s3_error(self, status, code):
        body = f"<?xml version='1.0' encoding='UTF-8'?><Error><Code>{code}</Code><Message>{code}</Message></Error>".encode()
        self.answer(status, body, [("Content-Type", "application/xml")])

    def send_cut(self, status, headers, body):
        """Headers for the whole body, half of it, then the connection dropped."""
        self.send_response(status)
        for k, v in headers:
            if k.lower() not in ("content-length", "connection", "transfer-encoding"):
                self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body[: len(body) // 2])
        self.wfile.flush()
        self.connection.shutdown(socket.SHUT_RDWR)
        self.close_connection = True

    def handle_any(self):
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        path = self.path
        if path == "/__log__":
            with LOCK:
                return self.answer(200, json.dumps(LOG).encode())
        if path == "/__faults__":
            with LOCK:
                FAULTS.update(json.loads(body))
            return self.answer(200)
        with LOCK:
            LOG.append([self.command, path, self.headers.get("Range")])
        bucket = path.lstrip("/").split("/")[0].split("?")[0]
        if FAULTS["deny"] and bucket == FAULTS["deny"]:
            return self.s3_error(403, "AccessDenied")
        if self.command == "GET" and take_fault("503", path):
            return self.s3_error(503, "SlowDown")
        cut = self.command == "GET" and take_fault("cut", path)
        if path.startswith("/files/"):
            return self.serve_file(path[len("/files/") :], cut)
        conn = http.client.HTTPConnection("127.0.0.1", MOTO_PORT)
        headers = {k: v for k, v in self.headers.items() if k.lower() not in ("connection",)}
        conn.request(self.command, path, body=body, headers=headers)
        r = conn.getresponse()
        data = r.read()
        out = [(k, v) for k, v in r.getheaders() if k.lower() not in ("content-length", "connection", "transfer-encoding")]
        if cut:
            return self.send_cut(r.status, out, data)
        # A HEAD's length is the object's, not its empty body's.
        self.answer(r.status, data, out, r.getheader("Content-Length") if self.command == "HEAD" else None)

    def serve_file(self, rel, cut):
        full = os.path.join(FILES, rel)
        if ".." in rel.split("/") or not os.path.isfile(full):
            return self.answer(404, b"not found")
        data = open(full, "rb").read()
        st = os.stat(full)
        etag = '"' + hashlib.md5(data).hexdigest() + '"'
        headers = [
            ("ETag", etag),
            ("Last-Modified", email.utils.formatdate(st.st_mtime, usegmt=True)),
            ("Accept-Ranges", "bytes"),
        ]
        want = self.headers.get("If-Match")
        if want and want != etag:
            return self.answer(412, b"precondition failed")
        status, part = 200, data
        rng = self.headers.get("Range")
        if rng and rng.startswith("bytes="):
            a, b = rng[len("bytes=") :].split("-")
            start = int(a) if a else len(data) - int(b)
            end = min(int(b), len(data) - 1) if (a and b) else len(data) - 1
            status, part = 206, data[start : end + 1]
            headers.append(("Content-Range", f"bytes {start}-{end}/{len(data)}"))
        if cut:
            return self.send_cut(status, headers, part)
        self.answer(status, part, headers, len(part))

    do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = handle_any


logging.getLogger("werkzeug").setLevel(logging.ERROR)
moto = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
moto.start()
MOTO_PORT = moto._server.server_port
proxy = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
threading.Thread(target=proxy.serve_forever, daemon=True).start()
port = proxy.server_address[1]
print(json.dumps({"s3": f"http://127.0.0.1:{port}", "http": f"http://127.0.0.1:{port}/files"}), flush=True)
sys.stdin.read()
proxy.shutdown()
moto.stop()
