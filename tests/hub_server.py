"""A Hugging Face Hub look-alike HTTP server for tests and benchmarks, on the standard library.

Hand-written because no well-kept library serves the Hub's HTTP API offline: huggingface_hub's own tests run
against the staging Hub, and patching Python calls would skip exactly what these tests are for, the real
huggingface_hub 2.x (HfApi, HfFileSystem, hf_hub_download) and datasets 5 streaming stack talking HTTP.

Implemented, as read from those sources and checked on the wire (see tests/test_hub_server.py):

- GET  /api/datasets/{id}[/revision/{rev}]     HfApi.dataset_info/repo_info, HfFileSystem.resolve_path
- GET  /api/datasets/{id}/tree/{rev}[/{path}]  HfApi.list_repo_tree (HfFileSystem ls/glob/find), recursive, expand
- POST /api/datasets/{id}/paths-info/{rev}     HfApi.get_paths_info (HfFileSystem.info)
- HEAD /datasets/{id}/resolve/{rev}/{path}     hf_hub_download's metadata call (X-Repo-Commit, ETag, size)
- GET  same, with Range                        downloads, HfFileSystemFile block reads, HfFileSystemStreamFile resumes
- the same for model repositories (`add_model`): /api/models/{id}/... and /{id}/resolve/{rev}/{path}, what
  transformers' from_pretrained and hf_hub_download ask

Revisions are branch or tag names (URL-quoted, e.g. refs%2Fconvert%2Fparquet) or full commit shas; errors carry
the Hub's X-Error-Code so huggingface_hub raises its typed errors. No pagination, redirects, xet, or writes.
Faults (status answers, mid-body connection resets, stalls, latency) can be set and cleared while it runs.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import socket
import struct
import threading
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

_LFS_MIN_SIZE = 10 * 2**20  # the Hub rejects larger non-LFS files; binary files go to LFS via .gitattributes


def _git_oid(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _is_text(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return b"\0" not in data


@dataclass
class _File:
    data: bytes
    oid: str  # git blob id; of the LFS pointer for LFS files, as on the Hub
    sha256: str | None = None  # set for LFS files, which the Hub tags with their sha256 instead of the git id
    pointer_size: int = 0

    @classmethod
    def of(cls, data: bytes) -> _File:
        if _is_text(data) and len(data) < _LFS_MIN_SIZE:
            return cls(data, _git_oid(data))
        sha256 = hashlib.sha256(data).hexdigest()
        pointer = f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {len(data)}\n".encode()
        return cls(data, _git_oid(pointer), sha256, len(pointer))


@dataclass
class _Commit:
    sha: str
    files: dict[str, _File]
    title: str
    date: str
    parent: _Commit | None = None

    def dirs(self) -> set[str]:
        return {p.rsplit("/", i)[0] for p in self.files for i in range(1, p.count("/") + 1)}

    def last_change(self, path: str) -> _Commit:
        """The commit that last changed `path`, for `lastCommit` in expanded listings."""
        commit = self
        while commit.parent is not None and _subtree(commit.parent, path) == _subtree(commit, path):
            commit = commit.parent
        return commit


def _subtree(commit: _Commit, path: str) -> list[tuple[str, str]]:
    return sorted((p, f.oid) for p, f in commit.files.items() if p == path or p.startswith(path + "/"))


@dataclass
class _Repo:
    kind: str = "dataset"  # or "model": a URL of the other kind does not find it, as on the Hub
    commits: dict[str, _Commit] = field(default_factory=dict)
    refs: dict[str, str] = field(default_factory=dict)  # branches and tags, by name, to a commit sha


@dataclass
class Fault:
    """One injected fault; `times=None` keeps it until `HubServer.clear_faults()`, `times=0` ends it now."""

    repo: str
    path: str = "*"  # fnmatch glob on the path in the repo; repo-level API calls have the path ""
    kind: str | None = None  # only requests of this kind (see `Request.kind`)
    status: int | None = None
    error_code: str | None = None
    retry_after: int | None = None
    reset_after: int | None = None  # body bytes sent before the connection is reset
    stall: float = 0.0
    stall_after: int = 0  # body bytes sent before stalling
    times: int | None = None
    hits: int = 0


@dataclass(frozen=True)
class Request:
    method: str
    path: str  # as sent, with the query
    kind: str  # info, tree, paths-info, resolve-head, resolve-get or other
    repo: str | None
    status: int
    range: str | None = None
    fault: str | None = None  # status, reset or stall when a fault answered
    at: float = 0.0  # time.monotonic() on arrival, to measure clients' retry delays


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # huggingface_hub keeps connections alive; resets must hit a live one
    timeout = 120
    server: _Server

    def log_message(self, format: str, *args: object) -> None:
        pass  # HubServer.requests is the log

    def _handle(self) -> None:
        hub = self.server.hub
        self._status, self._fault_name, self._kind, self._repo, self._logged = 0, None, "other", None, False
        self._at = time.monotonic()
        try:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if hub.latency:
                hub._stopping.wait(hub.latency)
            self._dispatch(hub, body)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True  # the client went away: its business, not a server error
        except Exception as exc:  # a server bug must fail the test, not hang it
            hub.errors.append(f"{self.command} {self.path}: {exc!r}")
            self.close_connection = True
            if not self._status:
                self._json(500, {"error": repr(exc)})
        finally:
            self._record()

    do_GET = do_HEAD = do_POST = _handle

    def _record(self) -> None:
        # Logged once the status is sent, so a test sees a stalled request while it stalls.
        if self._logged:
            return
        self._logged = True
        hub = self.server.hub
        with hub._lock:
            hub._log.append(Request(self.command, self.path, self._kind, self._repo, self._status,
                                    self.headers.get("Range"), self._fault_name, self._at))
            hub.counts[self._kind] += 1

    def _dispatch(self, hub: HubServer, body: bytes) -> None:
        url = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        parts = url.path.strip("/").split("/")
        kind = "dataset"
        if parts[:2] in (["api", "datasets"], ["api", "models"]) and len(parts) >= 4:
            kind = "model" if parts[1] == "models" else "dataset"
            self._repo, rest = f"{unquote(parts[2])}/{unquote(parts[3])}", parts[4:]
            if not rest or rest[0] == "revision":
                self._kind, segs = "info", rest[1:] or ["main"]
            elif rest[0] in ("tree", "paths-info") and len(rest) >= 2:
                self._kind, segs = rest[0], rest[1:]
            else:
                return self._error(404, "Sorry, we can't find the page you are looking for.")
        elif len(parts) >= 6 and parts[0] == "datasets" and parts[3] == "resolve":
            self._repo, segs = f"{unquote(parts[1])}/{unquote(parts[2])}", parts[4:]
            self._kind = f"resolve-{self.command.lower()}"
        elif len(parts) >= 5 and parts[2] == "resolve":  # a model's files: /{owner}/{name}/resolve/{rev}/{path}
            kind, self._repo, segs = "model", f"{unquote(parts[0])}/{unquote(parts[1])}", parts[3:]
            self._kind = f"resolve-{self.command.lower()}"
        else:
            return self._error(404, "Sorry, we can't find the page you are looking for.")
        repo = hub._repos.get(self._repo)
        repo = repo if repo is not None and repo.kind == kind else None
        commit, path = _split_revision(repo, segs, whole=self._kind == "info")
        fault = hub._take_fault(self._repo, path, self._kind)
        if fault is not None and fault.status is not None:
            self._fault_name = "status"
            return self._fault_status(fault)
        if repo is None:
            return self._error(404, "Repository not found", "RepoNotFound")
        if commit is None:
            return self._error(404, f"Invalid rev id: {unquote(segs[0])}", "RevisionNotFound")
        if self._kind == "info":
            return self._json(200, _info(self._repo, commit, query))
        if self._kind == "paths-info":
            form = parse_qs(body.decode())  # huggingface_hub posts a form: paths=a&paths=b&expand=false
            paths, expand = [p.strip("/") for p in form.get("paths", [])], form.get("expand") == ["true"]
            entries = [_entry(commit, p, expand) for p in paths if p in commit.files or p in commit.dirs()]
            return self._json(200, entries)
        if self._kind == "tree":
            if path and path not in commit.dirs():
                return self._error(404, f"{path} does not exist on \"{unquote(segs[0])}\"", "EntryNotFound")
            recursive, expand = query.get("recursive") == "true", query.get("expand") == "true"
            prefix = path + "/" if path else ""
            names = [p for p in sorted(commit.dirs()) + sorted(commit.files)
                     if p.startswith(prefix) and (recursive or "/" not in p[len(prefix):])]
            return self._json(200, [_entry(commit, p, expand) for p in names])
        file = commit.files.get(path)
        if file is None:
            return self._error(404, "Entry not found", "EntryNotFound", {"X-Repo-Commit": commit.sha})
        self._send_file(hub, commit, file, fault)

    def _send_file(self, hub: HubServer, commit: _Commit, file: _File, fault: Fault | None) -> None:
        size, start, end = len(file.data), 0, len(file.data) - 1
        headers = {"Accept-Ranges": "bytes", "ETag": f'"{file.sha256 or file.oid}"', "X-Repo-Commit": commit.sha,
                   "Content-Type": "application/octet-stream" if file.sha256 else "text/plain; charset=utf-8"}
        wanted = self.headers.get("Range")
        if wanted:
            span = _parse_range(wanted, size)
            if span is None:
                return self._send(416, b"", {**headers, "Content-Range": f"bytes */{size}"})
            start, end = span
            headers["Content-Range"] = f"bytes {start}-{end}/{size}"
        body = file.data[start:end + 1]
        if self.command == "HEAD" or fault is None:
            return self._send(206 if wanted else 200, body, headers)
        self._fault_name = "reset" if fault.reset_after is not None else "stall"
        cut = fault.reset_after if fault.reset_after is not None else fault.stall_after
        self._send(206 if wanted else 200, body[:cut], {**headers, "Content-Length": str(len(body))})
        if fault.reset_after is not None or hub._stopping.wait(fault.stall):
            return self._reset()
        self.wfile.write(body[cut:])

    def _fault_status(self, fault: Fault) -> None:
        if fault.status in (401, 403):
            what = "authenticated" if fault.status == 401 else "granted access"
            message = f"Access to dataset {self._repo} is restricted. You must be {what} to access it."
            return self._error(fault.status, message, fault.error_code or "GatedRepo")
        if fault.status == 404:
            return self._error(404, "Repository not found", fault.error_code or "RepoNotFound")
        extra = {"Retry-After": str(fault.retry_after)} if fault.retry_after is not None else {}
        message = "You have been rate-limited." if fault.status == 429 else "Internal Error"
        self._error(fault.status or 500, message, fault.error_code, extra)

    def _reset(self) -> None:
        # SO_LINGER with a zero timeout makes close() send RST, as a dropped load balancer connection does.
        self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.connection.close()
        self.close_connection = True

    def _error(self, status: int, message: str, code: str | None = None, extra: dict[str, str] | None = None) -> None:
        headers = {"X-Error-Message": message, **({"X-Error-Code": code} if code else {}), **(extra or {})}
        self._json(status, {"error": message}, headers)

    def _json(self, status: int, payload: object, headers: dict[str, str] | None = None) -> None:
        body = json.dumps(payload).encode()
        self._send(status, body, {"Content-Type": "application/json; charset=utf-8", **(headers or {})})

    def _send(self, status: int, body: bytes, headers: Mapping[str, str]) -> None:
        self._status = status
        self.send_response(status)
        headers = {"Content-Length": str(len(body)), **headers}
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()
        self._record()
        if self.command != "HEAD":
            self.wfile.write(body)


def _split_revision(repo: _Repo | None, segs: list[str], whole: bool) -> tuple[_Commit | None, str]:
    """(commit, path) from the URL segments after the repo; a revision may span segments if sent unquoted."""
    for n in [len(segs)] if whole else range(1, len(segs) + 1):
        rev = unquote("/".join(segs[:n]))
        sha = repo.refs.get(rev, rev) if repo is not None else None
        if repo is not None and sha in repo.commits:
            return repo.commits[sha], unquote("/".join(segs[n:])).strip("/")
    return None, unquote("/".join(segs[1:])).strip("/")


def _parse_range(header: str, size: int) -> tuple[int, int] | None:
    """The first span of a Range header, clipped to the file; None when unsatisfiable (416)."""
    unit, _, spec = header.partition("=")
    first, _, last = spec.split(",")[0].strip().partition("-")
    if unit.strip() != "bytes" or not (first or last) or not (first + last).isdigit():
        return None
    if not first:
        start, end = max(size - int(last), 0), size - 1
    else:
        start, end = int(first), min(int(last), size - 1) if last else size - 1
    return (start, end) if start <= end and start < size else None


def _entry(commit: _Commit, path: str, expand: bool) -> dict:
    file = commit.files.get(path)
    if file is None:
        oid = hashlib.sha1(json.dumps(_subtree(commit, path)).encode()).hexdigest()
        out: dict = {"type": "directory", "oid": oid, "size": 0, "path": path}
    else:
        out = {"type": "file", "oid": file.oid, "size": len(file.data), "path": path}
        if file.sha256:
            out["lfs"] = {"oid": file.sha256, "size": len(file.data), "pointerSize": file.pointer_size}
    if expand:
        last = commit.last_change(path)
        out["lastCommit"] = {"id": last.sha, "title": last.title, "date": last.date}
        if file is not None:
            out["securityFileStatus"] = {"status": "safe", "avScan": {"virusFound": False},
                                         "pickleImportScan": {"highestSafetyLevel": "innocuous", "imports": []}}
    return out


def _info(repo_id: str, commit: _Commit, query: Mapping[str, str]) -> dict:
    first = commit
    while first.parent is not None:
        first = first.parent
    siblings = []
    for path, file in sorted(commit.files.items()):
        sibling: dict = {"rfilename": path}
        if query.get("blobs") == "true":
            lfs = {"size": len(file.data), "sha256": file.sha256, "pointerSize": file.pointer_size}
            sibling.update(size=len(file.data), blobId=file.oid, lfs=lfs if file.sha256 else None)
        siblings.append(sibling)
    info = {"_id": hashlib.sha1(repo_id.encode()).hexdigest()[:24], "id": repo_id, "author": repo_id.split("/")[0],
            "sha": commit.sha, "createdAt": first.date, "lastModified": commit.date, "private": False,
            "gated": False, "disabled": False, "downloads": 0, "likes": 0, "tags": [], "siblings": siblings,
            "usedStorage": sum(len(f.data) for f in commit.files.values())}
    readme = commit.files.get("README.md")
    if readme is not None and readme.data.startswith(b"---"):
        import yaml  # datasets' own dependency

        card = yaml.safe_load(readme.data.decode().split("---")[1])
        if isinstance(card, dict):
            info["cardData"] = card
    if "expand" in query:  # only the asked properties, as the Hub answers
        info = {k: v for k, v in info.items() if k in ("_id", "id", *query["expand"].split(","))}
    return info


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    hub: HubServer


class HubServer:
    """Dataset and model repositories served on 127.0.0.1; see the module docstring for the endpoints."""

    def __init__(self) -> None:
        self._repos: dict[str, _Repo] = {}
        self._faults: list[Fault] = []
        self._log: list[Request] = []
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._clock = 1_700_000_000
        self.latency = 0.0  # seconds added to every request
        self.counts: Counter[str] = Counter()  # requests per kind
        self.errors: list[str] = []  # server-side exceptions; the fixture fails the test on any
        self._httpd = _Server(("127.0.0.1", 0), _Handler)
        self._httpd.hub = self
        self.endpoint = f"http://127.0.0.1:{self._httpd.server_address[1]}"
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="hub-server", daemon=True)

    def start(self) -> HubServer:
        self._thread.start()
        return self

    def close(self) -> None:
        self._stopping.set()  # ends stalls and latency sleeps
        self._httpd.shutdown()
        self._httpd.server_close()

    def add_dataset(self, repo_id: str, files: Mapping[str, bytes | str | Path], *, branch: str = "main",
                    message: str = "Upload") -> str:
        """Commits `files` (bytes, text, or a local Path to read) as the whole content of `branch`; returns the sha.

        The branch moves to the new commit; earlier commits stay readable by sha.
        """
        return self._commit("dataset", repo_id, files, branch, message)

    def add_model(self, repo_id: str, files: Mapping[str, bytes | str | Path], *, branch: str = "main",
                  message: str = "Upload") -> str:
        """As `add_dataset`, for a model repository (e.g. a saved model folder's files)."""
        return self._commit("model", repo_id, files, branch, message)

    def _commit(self, kind: str, repo_id: str, files: Mapping[str, bytes | str | Path], branch: str,
                message: str) -> str:
        content = {p.strip("/"): _File.of(v.read_bytes() if isinstance(v, Path) else
                                          v.encode() if isinstance(v, str) else bytes(v)) for p, v in files.items()}
        with self._lock:
            repo = self._repos.setdefault(repo_id, _Repo(kind))
            if repo.kind != kind:
                raise ValueError(f"{repo_id} is a {repo.kind} repository here")
            parent = repo.commits.get(repo.refs.get(branch, ""))
            listing = json.dumps([parent.sha if parent else None, message,
                                  sorted((p, f.oid) for p, f in content.items())])
            sha = hashlib.sha1(listing.encode()).hexdigest()
            self._clock += 60
            date = time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(self._clock))
            repo.commits[sha] = _Commit(sha, content, message, date, parent)
            repo.refs[branch] = sha
        return sha

    def set_ref(self, repo_id: str, name: str, revision: str) -> str:
        """Points branch or tag `name` (e.g. "v1.0", "refs/convert/parquet") at `revision`; returns its sha."""
        with self._lock:
            repo = self._repos[repo_id]
            sha = repo.commits[repo.refs.get(revision, revision)].sha
            repo.refs[name] = sha
        return sha

    def fail(self, repo_id: str, status: int, *, times: int | None = None, path: str = "*", kind: str | None = None,
             retry_after: int | None = None, error_code: str | None = None) -> Fault:
        """Answers `status` (401/403 gated, 404 repo not found, 429, 5xx) to matching requests."""
        return self._add(Fault(repo_id, path, kind, status=status, times=times, retry_after=retry_after,
                               error_code=error_code))

    def reset_after(self, repo_id: str, nbytes: int, *, times: int | None = None, path: str = "*") -> Fault:
        """Resets the connection after `nbytes` of a file body (resolve GETs only)."""
        return self._add(Fault(repo_id, path, "resolve-get", reset_after=nbytes, times=times))

    def stall(self, repo_id: str, seconds: float, *, after: int = 0, times: int | None = None,
              path: str = "*") -> Fault:
        """Sends headers and `after` body bytes of a file, waits `seconds`, then sends the rest."""
        return self._add(Fault(repo_id, path, "resolve-get", stall=seconds, stall_after=after, times=times))

    def reset(self) -> None:
        """Forgets every dataset, fault, request and count: the state of a new server, on the same port."""
        with self._lock:
            self._repos.clear()
            self._faults.clear()
            self._log.clear()
        self.counts.clear()
        self.errors.clear()
        self.latency = 0.0

    def clear_faults(self) -> None:
        """Drops every fault and the latency."""
        with self._lock:
            self._faults.clear()
        self.latency = 0.0

    def _add(self, fault: Fault) -> Fault:
        with self._lock:
            self._faults.append(fault)
        return fault

    def _take_fault(self, repo_id: str | None, path: str, kind: str) -> Fault | None:
        with self._lock:
            for fault in self._faults:
                if (fault.repo == repo_id and fnmatch.fnmatchcase(path, fault.path) and fault.kind in (None, kind)
                        and (fault.times is None or fault.hits < fault.times)):
                    fault.hits += 1
                    return fault
        return None

    @property
    def requests(self) -> list[Request]:
        with self._lock:
            return list(self._log)

    def env(self, tmp_path: Path, **overrides: object) -> dict[str, str]:
        """Environment for a subprocess that reads through this server, with its caches under `tmp_path`."""
        home = Path(tmp_path) / "hf_home"
        drop = {"HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_TOKEN_PATH", "HF_HUB_CACHE", "HF_DATASETS_CACHE",
                "HF_XET_CACHE", "HF_ASSETS_CACHE", "HUGGINGFACE_HUB_CACHE", "TRANSFORMERS_CACHE"}
        env = {k: v for k, v in os.environ.items() if k not in drop and not k.lower().endswith("_proxy")}
        env.update(HF_ENDPOINT=self.endpoint, HF_HOME=str(home), HF_HUB_CACHE=str(home / "hub"),
                   HF_DATASETS_CACHE=str(home / "datasets"), XDG_CACHE_HOME=str(home / "xdg"),
                   HF_HUB_OFFLINE="0", HF_DATASETS_OFFLINE="0", TRANSFORMERS_OFFLINE="0",
                   HF_HUB_DISABLE_TELEMETRY="1", HF_HUB_DISABLE_IMPLICIT_TOKEN="1", HF_HUB_DISABLE_PROGRESS_BARS="1",
                   NO_PROXY="127.0.0.1,localhost", no_proxy="127.0.0.1,localhost")
        env.update({k: str(v) for k, v in overrides.items()})
        return env


def dataset_card(train_files: str, title: str) -> str:
    """A dataset repo's README.md whose YAML gives its train split's files (a glob in the repo), as the Hub reads
    it to find the splits."""
    return (f"---\nconfigs:\n- config_name: default\n  data_files:\n  - split: train\n    path: {train_files}\n---\n"
            f"# {title}\n")

