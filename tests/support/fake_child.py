"""A FAKE server child: a small stdlib-only script that the lifecycle tests
(``tests/process/test_child.py``) run under :class:`ChildProcess` instead of a real server, so that
spawn, readiness, stop, exit and restart are tested in milliseconds.

It is no server of ours: it binds ``--port`` on 127.0.0.1 and, with ``--http``, answers
``GET /health`` with 200 (anything else 404). Its log goes to stderr. SIGTERM is handled as a
server handles it (a line, then exit 0): a handler, so a SIGSTOPped fake sees it only once it
runs again (SIGCONT), as llama-server does. Faults on command:

``--delay S``        wait S seconds before binding (a load)
``--say TEXT``       print TEXT (a line) to stderr once bound (``--say`` may repeat)
``--no-bind``        never bind (a child that never becomes ready)
``--fail-start C``   print the ``--say`` lines, then exit with code C before binding
``--ignore-term``    ignore SIGTERM (only SIGKILL ends it)
``--exit-after S``   exit S seconds after binding, with ``--code C`` (default 1)
``--fork``           fork a grandchild that sleeps (into the same process group)

Real llama-server and rpc-server children (tests/process/test_instance.py, test_rpc_worker.py) are
what prove the lifecycle against the real programs; this fake only reaches the cases they cannot
produce cheaply (a child that ignores SIGTERM, a crash loop in a few hundred milliseconds).
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer


class _Health(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        code = 200 if self.path == "/health" else 404
        body = b'{"status":"ok"}' if code == 200 else b"{}"
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


def _graceful(_sig: int, _frame: object) -> None:
    print("fake child got SIGTERM: shutting down", file=sys.stderr, flush=True)
    os._exit(0)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--http", action="store_true")
    p.add_argument("--delay", type=float, default=0.0)
    p.add_argument("--say", action="append", default=[])
    p.add_argument("--no-bind", action="store_true")
    p.add_argument("--ignore-term", action="store_true")
    p.add_argument("--exit-after", type=float, default=None)
    p.add_argument("--code", type=int, default=1)
    p.add_argument("--fork", action="store_true")
    p.add_argument("--fail-start", type=int, default=None)
    a = p.parse_args()
    signal.signal(signal.SIGTERM, signal.SIG_IGN if a.ignore_term else _graceful)
    if a.fork and os.fork() == 0:
        time.sleep(3600)
        os._exit(0)
    print(f"fake child pid {os.getpid()} starting", file=sys.stderr, flush=True)
    time.sleep(a.delay)
    if a.fail_start is not None:
        for text in a.say:
            print(text, file=sys.stderr, flush=True)
        os._exit(a.fail_start)
    if a.no_bind:
        for text in a.say:
            print(text, file=sys.stderr, flush=True)
        time.sleep(3600)
    if a.http:
        server = HTTPServer(("127.0.0.1", a.port), _Health)
        threading.Thread(target=server.serve_forever, daemon=True).start()
    else:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", a.port))
        sock.listen()
    for text in a.say:
        print(text, file=sys.stderr, flush=True)
    if a.exit_after is not None:
        time.sleep(a.exit_after)
        print(f"fake child exiting with code {a.code}", file=sys.stderr, flush=True)
        os._exit(a.code)
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main()
