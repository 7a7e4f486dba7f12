"""The test Hub server is faithful enough: the real huggingface_hub and datasets read through it as from the Hub.

Each library check runs in a subprocess (huggingface_hub reads HF_ENDPOINT and the offline flags at import, and
this suite runs offline); the protocol checks talk to the server directly with http.client.
"""

from __future__ import annotations

import hashlib
import http.client
import io
import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sparknet.common.runtime import PROJECT_ROOT
from tests.hub_server import HubServer

PRELUDE = """
import json, os, sys, time
ARGS = json.loads(os.environ["SNIPPET_ARGS"])

def outcome(fn):
    try:
        return {"value": fn()}
    except Exception as e:
        return {"error": type(e).__name__, "message": str(e)}
"""

README = """---
configs:
- config_name: default
  data_files:
  - split: train
    path: data/train-*.parquet
  - split: validation
    path: data/validation-*.parquet
---
# A test dataset
"""

STREAM = """
from datasets import load_dataset
def stream(split="train", **kwargs):
    return [row["text"] for row in load_dataset(ARGS["repo"], split=split, streaming=True, **kwargs)]
"""
TIMED_STREAM = "t = time.time(); rows = stream(); print(json.dumps([rows, time.time() - t]))"


def parquet(rows: list[str]) -> bytes:
    buf = io.BytesIO()
    pq.write_table(pa.table({"text": rows}), buf, row_group_size=64)
    return buf.getvalue()


def run(hub: HubServer, tmp_path: Path, code: str, *, stream: bool = False, timeout: int = 240,
        env: dict | None = None, **args: object):
    """Runs `code` (after STREAM's `stream()` helper if `stream`) in a fresh interpreter reading through `hub`;
    returns what it printed as JSON last."""
    environ = hub.env(tmp_path, SNIPPET_ARGS=json.dumps(args), **(env or {}))
    code = PRELUDE + (STREAM if stream else "") + textwrap.dedent(code)
    proc = subprocess.run([sys.executable, "-c", code], cwd=PROJECT_ROOT, env=environ,
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def add_parquet_repo(hub: HubServer, repo: str = "user/pq", prefix: str = "row") -> tuple[str, list[str], list[str]]:
    train = [f"{prefix} {i}" for i in range(300)]
    valid = [f"{prefix} valid {i}" for i in range(40)]
    sha = hub.add_dataset(repo, {"README.md": README, "data/train-00000.parquet": parquet(train[:170]),
                                 "data/train-00001.parquet": parquet(train[170:]),
                                 "data/validation-00000.parquet": parquet(valid)})
    return sha, train, valid


def gets(hub: HubServer, path: str) -> list:
    return [r for r in hub.requests if r.kind == "resolve-get" and r.path.endswith(path)]


def test_parquet_splits_stream_exactly_the_rows_written(hub: HubServer, tmp_path: Path) -> None:
    _, train, valid = add_parquet_repo(hub)
    out = run(hub, tmp_path, "print(json.dumps([stream('train'), stream('validation')]))", stream=True,
              repo="user/pq")
    assert out == [train, valid]
    # The card's data_files were honoured: each shard was read, by Range requests, from the pinned commit.
    for shard in ("train-00000.parquet", "train-00001.parquet", "validation-00000.parquet"):
        assert gets(hub, shard) and all(r.status == 206 and r.range for r in gets(hub, shard))
    assert hub.counts["info"] >= 1 and hub.counts["tree"] >= 1 and hub.counts["resolve-head"] >= 1
    assert hub.counts["other"] == 0, [r.path for r in hub.requests if r.kind == "other"]


def test_jsonl_repo_without_card_is_inferred(hub: HubServer, tmp_path: Path) -> None:
    train, test = [f"line {i}" for i in range(250)], [f"test {i}" for i in range(30)]
    hub.add_dataset("user/js", {f"data/{name}.jsonl": "".join(json.dumps({"text": t}) + "\n" for t in rows)
                                for name, rows in (("train", train), ("test", test))})
    out = run(hub, tmp_path, "print(json.dumps([stream('train'), stream('test')]))", stream=True, repo="user/js")
    assert out == [train, test]
    assert {r.status for r in hub.requests if r.path.endswith("/README.md")} == {404}


def test_revision_pins_the_old_commit_after_the_branch_moved(hub: HubServer, tmp_path: Path) -> None:
    old, old_rows, _ = add_parquet_repo(hub, prefix="old")
    new, new_rows, _ = add_parquet_repo(hub, prefix="new")
    hub.set_ref("user/pq", "v1.0", old)
    hub.set_ref("user/pq", "refs/convert/parquet", old)
    assert old != new and re.fullmatch("[0-9a-f]{40}", new)
    out = run(hub, tmp_path, stream=True, code="""
        from huggingface_hub import HfApi
        api = HfApi()
        print(json.dumps({
            "pinned": stream(revision=ARGS["old"]), "tag": stream(revision="v1.0"), "branch": stream(revision="main"),
            "default": stream(), "sha": api.dataset_info(ARGS["repo"]).sha,
            "sha_old": api.dataset_info(ARGS["repo"], revision=ARGS["old"]).sha,
            "sha_ref": api.dataset_info(ARGS["repo"], revision="refs/convert/parquet").sha,
            "missing": outcome(lambda: api.dataset_info(ARGS["repo"], revision="nope"))["error"],
        }))""", repo="user/pq", old=old)
    assert out["pinned"] == out["tag"] == old_rows
    assert out["branch"] == out["default"] == new_rows
    assert (out["sha"], out["sha_old"], out["sha_ref"]) == (new, old, old)
    assert out["missing"] == "RevisionNotFoundError"
    assert any("/api/datasets/user/pq/revision/refs%2Fconvert%2Fparquet" in r.path for r in hub.requests)


def test_listing_info_and_download_agree_with_the_files(hub: HubServer, tmp_path: Path) -> None:
    first, _, _ = add_parquet_repo(hub)
    shard = parquet(["changed"])
    second = hub.add_dataset("user/pq", {"README.md": README, "data/train-00000.parquet": shard})
    out = run(hub, tmp_path, """
        from huggingface_hub import HfApi, HfFileSystem, hf_hub_download
        api, fs, repo = HfApi(), HfFileSystem(), ARGS["repo"]
        tree = {e.path: [type(e).__name__, getattr(e, "size", 0), e.last_commit.oid,
                         e.lfs.sha256 if getattr(e, "lfs", None) else None]
                for e in api.list_repo_tree(repo, repo_type="dataset", recursive=True, expand=True)}
        asked = ["data/train-00000.parquet", "data", "nope"]
        info = {e.path: getattr(e, "size", 0) for e in api.get_paths_info(repo, asked, repo_type="dataset")}
        path = hf_hub_download(repo, "data/train-00000.parquet", repo_type="dataset", revision=ARGS["first"])
        print(json.dumps({"tree": tree, "info": info, "find": fs.find(f"datasets/{repo}", detail=False),
                          "size": fs.info(f"datasets/{repo}/README.md")["size"],
                          "old_sha256": __import__("hashlib").sha256(open(path, "rb").read()).hexdigest(),
                          "commit": os.path.basename(os.path.dirname(os.path.dirname(path)))}))
        """, repo="user/pq", first=first)
    assert out["tree"] == {
        "README.md": ["RepoFile", len(README), first, None],
        "data": ["RepoFolder", 0, second, None],
        "data/train-00000.parquet": ["RepoFile", len(shard), second, hashlib.sha256(shard).hexdigest()],
    }
    assert out["info"] == {"data/train-00000.parquet": len(shard), "data": 0}
    assert out["find"] == ["datasets/user/pq/README.md", "datasets/user/pq/data/train-00000.parquet"]
    assert out["size"] == len(README)
    old_shard = parquet([f"row {i}" for i in range(170)])
    assert (out["old_sha256"], out["commit"]) == (hashlib.sha256(old_shard).hexdigest(), first)


def test_hffilesystem_seeks_with_range_requests(hub: HubServer, tmp_path: Path) -> None:
    data = bytes(range(256)) * 400
    hub.add_dataset("user/bin", {"blob.bin": data})
    out = run(hub, tmp_path, """
        from huggingface_hub import HfFileSystem
        with HfFileSystem(block_size=1000).open("datasets/user/bin/blob.bin", "rb") as f:
            f.seek(70_000)
            print(json.dumps(list(f.read(300))))
        """)
    assert bytes(out) == data[70_000:70_300]
    ranged = [(r.status, r.range) for r in gets(hub, "blob.bin")]
    assert ranged and all(status == 206 for status, _ in ranged)
    assert any(rng.startswith("bytes=70000-") for _, rng in ranged)


def test_missing_and_gated_repos_raise_typed_errors(hub: HubServer, tmp_path: Path) -> None:
    add_parquet_repo(hub, "user/gated")
    add_parquet_repo(hub, "user/forbidden")
    hub.fail("user/gated", 401)
    hub.fail("user/forbidden", 403)
    out = run(hub, tmp_path, """
        from datasets import load_dataset
        from huggingface_hub import HfApi
        api = HfApi()
        load = lambda repo: load_dataset(repo, split="train", streaming=True)
        print(json.dumps({
            "info_missing": outcome(lambda: api.dataset_info("user/missing")),
            "info_gated": outcome(lambda: api.dataset_info("user/gated")),
            "info_forbidden": outcome(lambda: api.dataset_info("user/forbidden")),
            "load_missing": outcome(lambda: load("user/missing")),
            "load_gated": outcome(lambda: load("user/gated")),
        }))""")
    assert out["info_missing"]["error"] == "RepositoryNotFoundError"
    assert out["info_gated"]["error"] == out["info_forbidden"]["error"] == "GatedRepoError"
    assert out["load_missing"]["error"] == "DatasetNotFoundError"
    assert "doesn't exist" in out["load_missing"]["message"]
    assert out["load_gated"]["error"] == "DatasetNotFoundError"
    assert "gated" in out["load_gated"]["message"] and "authenticated" in out["load_gated"]["message"]
    assert {r.status for r in hub.requests if r.repo == "user/gated"} == {401}


def test_missing_file_raises_entry_not_found(hub: HubServer, tmp_path: Path) -> None:
    sha, _, _ = add_parquet_repo(hub)
    out = run(hub, tmp_path, """
        from huggingface_hub import hf_hub_download
        print(json.dumps(outcome(lambda: hf_hub_download("user/pq", "nope.txt", repo_type="dataset"))))""")
    assert out["error"] == "RemoteEntryNotFoundError"
    # huggingface_hub caches the miss under the commit it reads from X-Repo-Commit.
    assert (tmp_path / f"hf_home/hub/datasets--user--pq/.no_exist/{sha}/nope.txt").exists()


@pytest.mark.slow
def test_single_500_on_a_data_file_is_retried(hub: HubServer, tmp_path: Path) -> None:
    """huggingface_hub's http_backoff retries 5xx on range reads (1 s, then 2, 4, 8, 8 s): one 500 is invisible."""
    _, train, _ = add_parquet_repo(hub)
    fault = hub.fail("user/pq", 500, times=1, path="data/train-00001.parquet")
    assert run(hub, tmp_path, "print(json.dumps(stream()))", stream=True, repo="user/pq") == train
    assert fault.hits == 1
    assert [r.status for r in gets(hub, "train-00001.parquet")][:2] == [500, 206]


@pytest.mark.slow
def test_connection_reset_mid_file_is_retried(hub: HubServer, tmp_path: Path) -> None:
    """A reset mid-body surfaces as httpx2.ReadError inside HfFileSystemFile._fetch_range, whose http_backoff
    retries it after 1 s; datasets never sees it and every row arrives once.

    Recorded for persistent resets: http_backoff gives up after 5 retries (1+2+4+8+8 s) and raises
    httpx2.ReadError; datasets' read_with_retries catches it (an httpx.RequestError), sleeps
    config.STREAMING_READ_RETRY_INTERVAL (5 s) and retries config.STREAMING_READ_MAX_RETRIES (20) times, then
    raises ConnectionError("Server Disconnected") from the ReadError: about 20 x 28 s, nearly ten minutes.
    """
    _, train, _ = add_parquet_repo(hub)
    fault = hub.reset_after("user/pq", 500, times=1, path="data/train-00001.parquet")
    assert run(hub, tmp_path, "print(json.dumps(stream()))", stream=True, repo="user/pq") == train
    assert fault.hits == 1
    assert [r.fault for r in gets(hub, "train-00001.parquet")][:2] == ["reset", None]


@pytest.mark.slow
def test_rate_limit_waits_for_retry_after(hub: HubServer, tmp_path: Path) -> None:
    """http_backoff waits Retry-After + 1 s on a 429 (its own backoff starts at 1 s)."""
    _, train, _ = add_parquet_repo(hub)
    hub.fail("user/pq", 429, times=1, path="data/train-00000.parquet", retry_after=3)
    out = run(hub, tmp_path, TIMED_STREAM, stream=True,
              repo="user/pq")
    assert out[0] == train and out[1] >= 4
    limited, retried = gets(hub, "train-00000.parquet")[:2]
    assert (limited.status, retried.status) == (429, 206)
    assert retried.at - limited.at >= 4


@pytest.mark.slow
def test_stalled_read_times_out_and_is_retried(hub: HubServer, tmp_path: Path) -> None:
    """A stalled body hits HF_HUB_DOWNLOAD_TIMEOUT (default 10 s) as httpx2.ReadTimeout, which http_backoff
    retries: with the timeout at 2 s the rows arrive long before the 60 s stall ends."""
    _, train, _ = add_parquet_repo(hub)
    hub.stall("user/pq", 60, after=100, times=1, path="data/train-00001.parquet")
    out = run(hub, tmp_path, TIMED_STREAM, stream=True,
              repo="user/pq", env={"HF_HUB_DOWNLOAD_TIMEOUT": 2})
    assert out[0] == train and 2 <= out[1] < 50
    stalled, retried = gets(hub, "train-00001.parquet")[:2]
    assert (stalled.fault, retried.fault, retried.status) == ("stall", None, 206)
    assert 2 <= retried.at - stalled.at < 50


@pytest.mark.slow
def test_latency_delays_every_request(hub: HubServer, tmp_path: Path) -> None:
    add_parquet_repo(hub)
    hub.latency = 1.5
    out = run(hub, tmp_path, """
        from huggingface_hub import HfApi
        api = HfApi()
        t = time.time(); sha = api.dataset_info("user/pq").sha
        print(json.dumps([sha, time.time() - t]))""")
    assert out[1] >= 1.5 and len(out[0]) == 40


def test_protocol_details(hub: HubServer) -> None:
    """Headers huggingface_hub relies on, and faults set and cleared while the server runs."""
    data = b"x" * 1000
    sha = hub.add_dataset("user/raw", {"a.txt": data})
    conn = http.client.HTTPConnection("127.0.0.1", int(hub.endpoint.rsplit(":", 1)[1]), timeout=30)

    def ask(method: str, path: str, **headers: str) -> tuple[http.client.HTTPResponse, bytes]:
        conn.request(method, path, headers=headers)
        resp = conn.getresponse()
        return resp, resp.read()

    resp, body = ask("HEAD", "/datasets/user/raw/resolve/main/a.txt")
    assert (resp.status, body, resp.headers["Content-Length"]) == (200, b"", "1000")
    assert resp.headers["X-Repo-Commit"] == sha and resp.headers["Accept-Ranges"] == "bytes"
    assert resp.headers["ETag"] == f'"{hashlib.sha1(b"blob 1000" + bytes(1) + data).hexdigest()}"'
    resp, body = ask("GET", f"/datasets/user/raw/resolve/{sha}/a.txt", Range="bytes=990-")
    assert (resp.status, body, resp.headers["Content-Range"]) == (206, b"x" * 10, "bytes 990-999/1000")
    resp, _ = ask("GET", "/datasets/user/raw/resolve/main/a.txt", Range="bytes=1000-")
    assert (resp.status, resp.headers["Content-Range"]) == (416, "bytes */1000")
    resp, body = ask("GET", "/api/datasets/user/raw/revision/nope")
    assert (resp.status, resp.headers["X-Error-Code"]) == (404, "RevisionNotFound") and json.loads(body)["error"]

    hub.fail("user/raw", 503, path="a.txt")
    assert [ask("GET", "/datasets/user/raw/resolve/main/a.txt")[0].status for _ in range(3)] == [503] * 3
    assert ask("GET", "/api/datasets/user/raw")[0].status == 200  # the glob spares repo-level calls
    hub.clear_faults()
    assert ask("GET", "/datasets/user/raw/resolve/main/a.txt")[1] == data

    hub.reset_after("user/raw", 100, times=1)
    with pytest.raises((http.client.IncompleteRead, ConnectionError)):
        ask("GET", "/datasets/user/raw/resolve/main/a.txt")
    conn.close()
    assert hub.counts["resolve-get"] == 7 and hub.counts["resolve-head"] == 1 and hub.counts["info"] == 2


def test_env_reads_through_the_server_with_private_caches(hub: HubServer, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_TOKEN", "hf_not_for_tests")
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.invalid:3128")
    env = hub.env(tmp_path, HF_HUB_ETAG_TIMEOUT=3)
    assert "HF_TOKEN" not in env and "HTTPS_PROXY" not in env
    assert (env["HF_ENDPOINT"], env["HF_HUB_OFFLINE"], env["HF_DATASETS_OFFLINE"]) == (hub.endpoint, "0", "0")
    assert env["HF_HUB_DISABLE_TELEMETRY"] == "1" and env["HF_HUB_ETAG_TIMEOUT"] == "3"
    for name in ("HF_HOME", "HF_HUB_CACHE", "HF_DATASETS_CACHE"):
        assert Path(env[name]).is_relative_to(tmp_path)
