"""Real HTTP and FTP servers on 127.0.0.1 for download tests, with switchable misbehaviour.

Each server runs in a thread for the length of a ``with`` block and records what clients asked for.
"""

from __future__ import annotations

import logging
import re
import socket
import threading
import warnings
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from functools import partial
from http.server import BaseHTTPRequestHandler, SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

with warnings.catch_warnings():
    # pyftpdlib is built on asyncore/asynchat, deprecated in this Python; irrelevant to these tests
    warnings.simplefilter("ignore", DeprecationWarning)
    from pyftpdlib.authorizers import DummyAuthorizer
    from pyftpdlib.handlers import FTPHandler
    from pyftpdlib.servers import FTPServer

_RANGE = re.compile(r"^bytes=(\d+)-$")
# how long the FTP loop blocks per poll; bounds how quickly the server stops
_FTP_POLL_S = 0.05


@dataclass
class Behaviour:
    """What the HTTP server does; request counters below are over all GET requests."""

    payload: bytes
    name: str = "data.bin"
    statuses: list[int] = field(default_factory=list)  # answer the first requests with these errors
    drop_first: int = 0  # then this many responses send `cut_after` body bytes and close the connection
    cut_after: int = 0
    stall_first: int = 0  # then this many send `cut_after` bytes and go silent for `stall_s`
    stall_s: float = 0.0
    ignore_range: bool = False  # always answer 200 with the whole body
    wrong_bytes: bool = False  # serve a corrupted body of the right length
    misplaced_ranges: int = 0  # this many 206 answers start one byte before the requested offset


class LoopbackHTTPServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, behaviour: Behaviour):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.behaviour = behaviour
        self.requests: list[dict[str, str]] = []  # headers of every request, in order
        self.bytes_served = 0  # body bytes written to sockets
        self.lock = threading.Lock()
        self.stop = threading.Event()

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host}:{port}/{self.behaviour.name}"

    def handle_error(self, request, client_address) -> None:
        pass  # a client hanging up on a stalled response is expected here


class _Handler(BaseHTTPRequestHandler):
    server: LoopbackHTTPServer

    def log_message(self, format, *args) -> None:
        pass

    def _send_body(self, data: bytes) -> None:
        self.wfile.write(data)
        with self.server.lock:
            self.server.bytes_served += len(data)

    def do_GET(self) -> None:
        srv, b = self.server, self.server.behaviour
        with srv.lock:
            index = len(srv.requests)
            srv.requests.append(dict(self.headers.items()))
            misplace = b.misplaced_ranges > 0 and "Range" in self.headers and not b.ignore_range
            if misplace:
                b.misplaced_ranges -= 1
        if index < len(b.statuses):
            self.send_error(b.statuses[index])
            return
        if self.path != "/" + b.name:
            self.send_error(404)
            return
        body = bytes(x ^ 0xFF for x in b.payload) if b.wrong_bytes else b.payload
        start, status = 0, 200
        match = _RANGE.match(self.headers.get("Range", ""))
        if match and not b.ignore_range:
            start, status = int(match.group(1)), 206
            if start >= len(body):
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{len(body)}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            if misplace:
                start -= 1
        chunk = body[start:]
        self.send_response(status)
        self.send_header("Content-Length", str(len(chunk)))
        self.send_header("Accept-Ranges", "bytes")
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
        self.end_headers()

        served = index - len(b.statuses)
        if served < b.drop_first + b.stall_first:
            # full Content-Length announced, part of the body sent, then the connection ends
            self._send_body(chunk[: b.cut_after])
            self.wfile.flush()
            if served >= b.drop_first:
                srv.stop.wait(b.stall_s)
            self.close_connection = True
            with suppress(OSError):
                self.connection.shutdown(socket.SHUT_WR)
            return
        self._send_body(chunk)


@contextmanager
def http_server(behaviour: Behaviour) -> Iterator[LoopbackHTTPServer]:
    server = LoopbackHTTPServer(behaviour)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.stop.set()
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


class _QuietStaticHandler(SimpleHTTPRequestHandler):
    def log_message(self, format, *args) -> None:
        pass


@contextmanager
def static_http_server(root: Path) -> Iterator[str]:
    """Serve the files under ``root`` (several, unlike LoopbackHTTPServer); yields ``http://127.0.0.1:PORT``."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(_QuietStaticHandler, directory=str(root)))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        host, port = server.server_address[:2]
        yield f"http://{host}:{port}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


class _RecordingFTPHandler(FTPHandler):
    commands: list[tuple[str, str]]  # (command, argument), set per server

    def pre_process_command(self, line, cmd, arg):
        self.commands.append((cmd, arg))
        return super().pre_process_command(line, cmd, arg)


@dataclass
class LoopbackFTP:
    url: str  # ftp://127.0.0.1:PORT ; append "/name" for a file in the served folder
    commands: list[tuple[str, str]]


@contextmanager
def ftp_server(root: Path) -> Iterator[LoopbackFTP]:
    """Anonymous read-only FTP serving ``root``."""
    logging.getLogger("pyftpdlib").setLevel(logging.WARNING)
    authorizer = DummyAuthorizer()
    authorizer.add_anonymous(str(root))
    commands: list[tuple[str, str]] = []
    handler = type("Handler", (_RecordingFTPHandler,), {"authorizer": authorizer, "commands": commands})
    server = FTPServer(("127.0.0.1", 0), handler)
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            server.serve_forever(timeout=_FTP_POLL_S, blocking=False, handle_exit=False)

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    host, port = server.address[:2]
    try:
        yield LoopbackFTP(url=f"ftp://{host}:{port}", commands=commands)
    finally:
        stop.set()
        thread.join(timeout=5)
        server.close_all()
