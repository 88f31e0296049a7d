"""A local stand-in for huggingface.co's file API, for the online half of the hub tests.

# recorded-shape stand-in: the machine has no route to huggingface.co, so the real
# huggingface-hub client is pointed (``hf_endpoint``) at this server, which answers the
# requests it makes with the status codes and headers the Hub uses: the tree listing
# (``GET /api/models/{repo}/tree/{rev}``), the revision info snapshot_download asks first
# (``GET /api/models/{repo}/revision/{rev}``), file metadata (``HEAD /{repo}/resolve/{rev}/{path}``:
# ``X-Repo-Commit``, ``ETag``, ``Content-Length``) and the download (``GET``, honouring
# ``Range``: ``bytes=N-`` and ``bytes=N-M``), and the errors (``X-Error-Code: GatedRepo`` on 401, ``RepoNotFound`` on 404).
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlparse

__all__ = ["StandinHub", "StandinRepo", "running_hub"]


@dataclass
class StandinRepo:
    files: dict[str, bytes]
    commit: str = "0123456789abcdef0123456789abcdef01234567"
    gated: bool = False
    cut_once: set[str] = field(default_factory=set)
    """Files whose first download is cut off halfway (a dropped connection)."""
    cut_always: set[str] = field(default_factory=set)
    ignore_range: bool = False
    """Answer every download with 200 and the whole file, as a mirror without range support does."""


@dataclass
class StandinHub:
    repos: dict[str, StandinRepo] = field(default_factory=dict)
    requests: list[tuple[str, str, str | None]] = field(default_factory=list)
    """(method, path, Range header) of every request, in order."""
    url: str = ""
    sent: list[tuple[str, int]] = field(default_factory=list)
    """(file, bytes written before the transfer ended or the client closed it) of every GET."""
    etags: dict[int, tuple[bytes, str]] = field(default_factory=dict)
    """Each file's sha256, computed once (a real model's 250 MB take ~0.5 s each time)."""

    def etag(self, data: bytes) -> str:
        known = self.etags.get(id(data))
        if known is None or known[0] is not data:
            known = self.etags[id(data)] = (data, hashlib.sha256(data).hexdigest())
        return known[1]


def _handler(hub: StandinHub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:
            pass

        def _error(self, status: int, code: str, message: str) -> None:
            body = json.dumps({"error": message}).encode()
            self.send_response(status)
            self.send_header("X-Error-Code", code)
            self.send_header("X-Error-Message", message)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def _repo(self, repo_id: str) -> StandinRepo | None:
            repo = hub.repos.get(repo_id)
            if repo is None:
                self._error(404, "RepoNotFound", "Repository not found")
                return None
            if repo.gated:
                self._error(
                    401, "GatedRepo", f"Access to model {repo_id} is restricted. You must have access to it."
                )
                return None
            return repo

        def _send_body(self, name: str, body: bytes) -> None:
            """The body in 64 KiB pieces, counting what went out before a client closed early."""
            sent = 0
            try:
                for at in range(0, len(body), 65536):
                    self.wfile.write(body[at : at + 65536])
                    sent += len(body[at : at + 65536])
            except (BrokenPipeError, ConnectionResetError):
                self.close_connection = True
            hub.sent.append((name, sent))

        def do_HEAD(self) -> None:
            self._serve()

        def do_GET(self) -> None:
            self._serve()

        def _serve(self) -> None:
            path = unquote(urlparse(self.path).path)
            hub.requests.append((self.command, path, self.headers.get("Range")))
            parts = path.strip("/").split("/")
            if parts[:2] == ["api", "models"] and len(parts) >= 6 and parts[4] == "tree":
                repo = self._repo(f"{parts[2]}/{parts[3]}")
                if repo is None:
                    return
                listing = [
                    {"type": "file", "path": p, "size": len(b), "oid": hashlib.sha1(b).hexdigest()}
                    for p, b in sorted(repo.files.items())
                ]
                body = json.dumps(listing).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                return
            if parts[:2] == ["api", "models"] and len(parts) >= 6 and parts[4] == "revision":
                repo = self._repo(f"{parts[2]}/{parts[3]}")
                if repo is None:
                    return
                info = {
                    "id": f"{parts[2]}/{parts[3]}",
                    "sha": repo.commit,
                    "siblings": [{"rfilename": p, "size": len(b)} for p, b in sorted(repo.files.items())],
                }
                body = json.dumps(info).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                return
            if len(parts) >= 5 and parts[2] == "resolve":
                repo = self._repo(f"{parts[0]}/{parts[1]}")
                if repo is None:
                    return
                name = "/".join(parts[4:])
                data = repo.files.get(name)
                if data is None:
                    self._error(404, "EntryNotFound", f"{name} does not exist")
                    return
                start, end = 0, len(data) - 1
                rng = self.headers.get("Range")
                ranged = bool(rng and rng.startswith("bytes=") and not repo.ignore_range)
                if ranged:
                    assert rng is not None
                    first, _, last = rng[6:].partition("-")
                    start = int(first or 0)
                    end = min(int(last), len(data) - 1) if last else len(data) - 1
                body = data[start : end + 1]
                self.send_response(206 if ranged else 200)
                self.send_header("X-Repo-Commit", repo.commit)
                self.send_header("ETag", f'"{hub.etag(data)}"')
                self.send_header("Accept-Ranges", "bytes")
                self.send_header("Content-Length", str(len(body)))
                if ranged:
                    self.send_header("Content-Range", f"bytes {start}-{end}/{len(data)}")
                self.end_headers()
                if self.command == "HEAD":
                    return
                if name in repo.cut_once or name in repo.cut_always:
                    repo.cut_once.discard(name)
                    self.wfile.write(body[: len(body) // 2])
                    self.wfile.flush()
                    self.close_connection = True
                    return
                self._send_body(name, body)
                return
            self._error(404, "EntryNotFound", "no such route")

    return Handler


@contextmanager
def running_hub(hub: StandinHub) -> Iterator[StandinHub]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(hub))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    hub.url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield hub
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
