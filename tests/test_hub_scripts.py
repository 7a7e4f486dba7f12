"""train_tokenizer_v5.py and eval_perplexity.py read Hub dataset ids through the loopback Hub (tests/hub_server.py)
as they read the same rows from local files (the same tokenizer, byte for byte; the same perplexity, exactly), keep
the HTTP client's request lines out of the console, and say in one line that a dataset is gated or missing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import HUB_REPO, hub_readme, random_run_folder, read_texts, run_script, write_config, write_jsonl
from tests.hub_server import HubServer


def _publish(hub: HubServer, texts: list[str], folder: Path, n: int) -> tuple[list[Path], str]:
    """`texts` as HUB_REPO's train split in `n` JSONL shards, and the same shards as local files prose.0.jsonl, ...
    (read in the same order: the Hub's data/train-0000{i}.jsonl sort as the local shards are listed)."""
    local = [write_jsonl(folder / f"prose.{i}.jsonl", texts[i::n]) for i in range(n)]
    sha = hub.add_dataset(HUB_REPO, {**{f"data/train-0000{i}.jsonl": p.read_bytes() for i, p in enumerate(local)},
                                 "README.md": hub_readme()})
    return local, sha


def _quiet(stderr: str) -> None:
    assert "HTTP Request" not in stderr and "HTTP/1.1" not in stderr, stderr[-3000:]


# --- train_tokenizer_v5.py ------------------------------------------------------------------------------------------

def _train_tokenizer(cfg: Path, out: Path, env: dict[str, str] | None = None):
    return run_script("train_tokenizer_v5.py", "--config", cfg, "--vocab_size", 512, "--max_bytes", 150_000,
                      "--heldout_docs", 5, "--shuffle_buffer", 50, "--output_dir", out, env=env)


@pytest.mark.slow
def test_a_tokenizer_trained_on_a_hub_id_is_the_one_trained_on_the_same_local_files(
        hub: HubServer, corpus_dir: Path, tmp_path: Path) -> None:
    local, sha = _publish(hub, read_texts(corpus_dir / "prose.train.jsonl"), tmp_path / "local", 8)
    code = str(corpus_dir / "code.train.jsonl")
    online = write_config(tmp_path / "hub.json", [{"name": HUB_REPO, "split": "train", "prob": 0.5},
                                                  {"name": "json", "data_files": code, "prob": 0.5}])
    offline = write_config(tmp_path / "local.json", [{"name": "json", "data_files": [str(p) for p in local],
                                                      "prob": 0.5},
                                                     {"name": "json", "data_files": code, "prob": 0.5}])
    proc = _train_tokenizer(online, tmp_path / "hub-tok", hub.env(tmp_path))
    assert proc.returncode == 0, proc.stderr[-4000:]
    _quiet(proc.stderr)
    assert hub.counts["resolve-get"] > 0  # read through the Hub
    # the same training on the local files, in this process (as the script calls it: its arguments above)
    from sparknet.bpe import train_tokenizer
    from sparknet.config.mix import load_config

    train_tokenizer(load_config(offline), tmp_path / "local-tok", vocab_size=512, max_bytes=150_000, heldout_docs=5,
                    shuffle_buffer=50)

    got, expected = tmp_path / "hub-tok", tmp_path / "local-tok"
    assert (got / "tokenizer.json").read_bytes() == (expected / "tokenizer.json").read_bytes()
    names = sorted(p.name for p in expected.iterdir())
    assert sorted(p.name for p in got.iterdir()) == names
    for name in names:
        if name != "training_report.json":  # names the config and its sources, which differ
            assert (got / name).read_bytes() == (expected / name).read_bytes(), name
    report, reference = (json.loads((d / "training_report.json").read_text()) for d in (got, expected))
    assert report["sources"] == reference["sources"] and set(report["sources"]) == {"prose", "code"}
    assert report["sources"]["prose"]["bytes"] > 0 and report["vocab_size"] == 512
    commits = {label: r["commit"] for label, r in report["source_revisions"].items()}
    assert commits == {"prose": sha, "code": None}  # the commit read, as the build records it


# --- eval_perplexity.py ---------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def model_dir(tokenizer_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A randomly initialised 2-layer GPT-2 (context 32) with the test tokenizer, as a run folder."""
    return random_run_folder(tokenizer_dir, tmp_path_factory.mktemp("models") / "hubrun")


def _eval(model: Path, data: object, eval_dir: Path, *extra: object, env: dict[str, str] | None = None):
    return run_script("eval_perplexity.py", "--models", json.dumps([str(model)]), "--data", data, "--context", 32,
                      "--stride", 24, "--batch_size", 32, "--eval_dir", eval_dir, *extra, env=env)


def _result(eval_dir: Path, model: Path, data: object) -> dict:
    # results are keyed by their whole setting (data, documents, window): the one on this data
    (row,) = [row for row in json.loads((eval_dir / model.name / "perplexity.json").read_text()).values()
              if row["data"] == str(data)]
    assert row["tokens"] > 0
    return {k: v for k, v in row.items() if k not in ("data", "seconds")}


def _short(path: Path, n: int) -> list[str]:
    """The first `n` documents of a corpus file, each cut to 2,000 characters: a few thousand tokens to score."""
    return [t[:2000] for t in read_texts(path)[:n]]


@pytest.mark.slow
def test_perplexity_on_a_hub_id_is_that_of_the_same_local_files(hub: HubServer, model_dir: Path, corpus_dir: Path,
                                                                tmp_path: Path) -> None:
    """DATA = the Hub id (its train split, streamed): every row, against the same shards as JSONL files."""
    texts = _short(corpus_dir / "prose.val.jsonl", 12)
    local, _ = _publish(hub, texts, tmp_path / "local", 4)
    env = hub.env(tmp_path)
    proc = _eval(model_dir, HUB_REPO, tmp_path / "eval", "--split", "train", env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    _quiet(proc.stderr)
    assert hub.counts["resolve-get"] > 0
    got = _result(tmp_path / "eval", model_dir, HUB_REPO)
    files = ",".join(str(p) for p in local)
    proc = _eval(model_dir, files, tmp_path / "eval")
    assert proc.returncode == 0, proc.stderr[-4000:]
    expected = _result(tmp_path / "eval", model_dir, files)
    assert (got.pop("kind"), got.pop("split"), expected.pop("kind"), expected.pop("split")) == (
        "dataset", "train", "files", None)
    assert got == expected
    assert got["bytes"] == sum(len(t.encode("utf-8")) for t in texts)


@pytest.mark.slow
def test_perplexity_on_a_mix_config_naming_a_hub_id_is_that_of_the_same_local_files(
        hub: HubServer, model_dir: Path, corpus_dir: Path, tmp_path: Path) -> None:
    """DATA = a mix config with the Hub id among its sources: the first HOLDOUT_ROWS rows of each source (here
    across two of the Hub dataset's shards), against the same config on the same shards as JSONL files."""
    local, _ = _publish(hub, _short(corpus_dir / "prose.val.jsonl", 12), tmp_path / "local", 4)
    code = write_jsonl(tmp_path / "code.jsonl", _short(corpus_dir / "code.val.jsonl", 6))
    online = write_config(tmp_path / "hub.json", [{"name": HUB_REPO, "split": "train", "prob": 0.5},
                                                  {"name": "json", "data_files": str(code), "prob": 0.5}])
    offline = write_config(tmp_path / "local.json", [{"name": "json", "data_files": [str(p) for p in local],
                                                      "prob": 0.5},
                                                     {"name": "json", "data_files": str(code), "prob": 0.5}])
    proc = _eval(model_dir, online, tmp_path / "eval", "--holdout_rows", 4, env=hub.env(tmp_path))
    assert proc.returncode == 0, proc.stderr[-4000:]
    _quiet(proc.stderr)
    assert hub.counts["resolve-get"] > 0
    got = _result(tmp_path / "eval", model_dir, online)
    proc = _eval(model_dir, offline, tmp_path / "eval", "--holdout_rows", 4)
    assert proc.returncode == 0, proc.stderr[-4000:]
    expected = _result(tmp_path / "eval", model_dir, offline)
    assert got == expected and got["kind"] == "config"
    four = [t for p in local for t in read_texts(p)][:4] + read_texts(code)[:4]  # rows of shards 0 and 1, then code's
    assert got["bytes"] == sum(len(t.encode("utf-8")) for t in four)


# --- a gated or missing dataset: one line ---------------------------------------------------------------------------

# 404 through each script's reader; 401 (the full tier) through one: what differs is the message, decided once for
# every reader (hub_access_error in sparknet/data/source/opening.py)
@pytest.mark.parametrize(("script", "status"), [
    ("train_tokenizer_v5.py", 404), ("eval_perplexity.py --data ID", 404), ("eval_perplexity.py --data CONFIG", 404),
    pytest.param("eval_perplexity.py --data CONFIG", 401, marks=pytest.mark.slow)])
def test_a_gated_or_missing_hub_dataset_is_one_line(script: str, status: int, hub: HubServer, model_dir: Path,
                                                    corpus_dir: Path, tmp_path: Path) -> None:
    _publish(hub, _short(corpus_dir / "prose.val.jsonl", 12), tmp_path / "local", 4)
    hub.fail(HUB_REPO, status)
    env = hub.env(tmp_path)
    cfg = write_config(tmp_path / "hub.json", [{"name": HUB_REPO, "split": "train", "prob": 0.5},
                                               {"name": "json", "data_files": str(corpus_dir / "code.val.jsonl"),
                                                "prob": 0.5}])
    out = tmp_path / "out"
    if script == "train_tokenizer_v5.py":
        proc = _train_tokenizer(cfg, out, env)
    elif script.endswith("ID"):
        proc = _eval(model_dir, HUB_REPO, out, "--split", "train", env=env)
    else:
        proc = _eval(model_dir, cfg, out, "--holdout_rows", 3, env=env)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr[-3000:]
    assert HUB_REPO in lines[0]
    if status == 401:
        assert "is gated: log in with `hf auth login` (or set HF_TOKEN)" in lines[0], lines[0]
    else:
        assert "does not exist on the Hub" in lines[0], lines[0]
    assert any(r.status == status for r in hub.requests)  # the Hub was asked, and said so
    assert not out.exists() or not any(out.rglob("*.json"))  # no tokenizer, no results
