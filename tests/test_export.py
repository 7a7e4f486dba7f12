"""export_model: a clean folder that loads, a card whose YAML header the Hub's parser accepts and whose body holds
the run's facts, and a push that is attempted (offline, or refused by the loopback Hub: one clear line, the token
never printed)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from sparknet.common.errors import UserError
from sparknet.eval.benchmarks import save_results
from sparknet.eval.reports import merge_json
from sparknet.eval.results import perplexity_setting
from sparknet.tokenizer import EOT
from tests.helpers import run_script
from tests.hub_server import HubServer

METADATA = {
    "config": {"path": "configs/mix.json", "mix": [{"name": "HuggingFaceFW/fineweb-edu", "prob": 0.7},
                                                   {"name": "json", "data_files": "a.jsonl", "prob": 0.3}]},
    "dataset": {"realised_mixture": {"train": {
        "fineweb-edu": {"tokens": 70123, "documents": 50, "share": 0.70123, "requested_share": 0.7},
        "local": {"tokens": 29877, "documents": 20, "share": 0.29877, "requested_share": 0.3}}}},
    "settings": {"learning_rate": 0.002, "batch_size": 8, "adam_betas": [0.9, 0.95]},
    "tokenizer": {"path": "tokenizer-test"}, "model": {"name": "sparknet-tiny"},
    "steps": 245, "tokens_seen": 501760, "metrics": {"eval_loss": 5.2055, "eval_bits_per_byte": 1.8892},
}


@pytest.fixture()
def run(random_model: Path, tmp_path: Path) -> tuple[Path, Path]:
    """A run folder with metadata, an optimizer file that must not be exported, and eval results."""
    folder = tmp_path / "checkpoints" / "myrun"
    shutil.copytree(random_model, folder)
    (folder / "training_metadata.json").write_text(json.dumps(METADATA))
    (folder / "checkpoint-10").mkdir()
    (folder / "checkpoint-10" / "optimizer.pt").write_bytes(b"x")
    evals = tmp_path / "eval" / "myrun"
    (evals / "plots").mkdir(parents=True)
    (evals / "plots" / "loss.png").write_bytes(b"\x89PNG fake")
    # written as the evaluation scripts write them
    row = {"model": str(folder), "data": "val.jsonl", "split": None, "documents": 12, "tokens": 1234, "context": 32,
           "stride": 16, "nll": 3.5, "perplexity": 33.1, "bits_per_byte": 1.7}
    merge_json(evals / "perplexity.json", perplexity_setting(row), row)
    save_results(evals / "benchmarks.json", {"arc_easy": {"acc": 0.41, "acc_stderr": 0.01, "items": 100, "shots": 0}})
    return folder, tmp_path


def test_export_folder_and_card(run: tuple[Path, Path]) -> None:
    from huggingface_hub import ModelCard
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, tmp = run
    out = tmp / "exported"
    proc = run_script("export_model.py", "--model", folder, "--output_dir", out, "--eval_dir", tmp / "eval",
                      "--license", "apache-2.0")
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "config.json", "generation_config.json", "loss.png",
                                                      "model.safetensors", "tokenizer.json", "tokenizer_config.json"]
    AutoModelForCausalLM.from_pretrained(str(out))
    tok = AutoTokenizer.from_pretrained(str(out))
    assert tok.pad_token == "<|endoftext|>"
    # the fine-tuning idiom: a user's document ended with the eos string ends with the eos id, as with GPT-2's
    assert tok("hello" + tok.eos_token)["input_ids"][-1] == tok.eos_token_id
    assert tok(["a", "b" + tok.eos_token])["input_ids"][1][-1] == tok.eos_token_id
    # SparkNet's own encoding of the same folder keeps a literal inside a document text, as training did: the
    # loader (evaluation, generation) and the packer (the build, the stream)
    import numpy as np

    from sparknet.data.encoding.packer import DocumentEncoder
    from sparknet.tokenizer import load_tokenizer

    document = f"a literal {EOT} inside a document"
    ours = load_tokenizer(str(out))
    assert ours.eos_token_id == tok.eos_token_id and ours.eos_token_id not in ours.encode(document)
    flat, lengths = DocumentEncoder((out / "tokenizer.json").read_text(), tok.eos_token_id, np.uint16)([document])
    assert flat.tolist() == [*ours.encode(document), tok.eos_token_id] and lengths.tolist() == [len(flat)]
    # nothing about how this machine loaded it (a downloader would inherit local_files_only), and no flag that
    # would make the eos string text for its users
    saved = json.loads((out / "tokenizer_config.json").read_text())
    assert not {"is_local", "local_files_only", "split_special_tokens"} & set(saved)
    card = ModelCard.load(out / "README.md")
    data = card.data.to_dict()
    # no language unless the exporter states one (LANGUAGE): the run knows its sources, not their languages
    assert data["license"] == "apache-2.0" and "language" not in data
    assert data["library_name"] == "transformers" and data["pipeline_tag"] == "text-generation"
    assert data["datasets"] == ["HuggingFaceFW/fineweb-edu"]  # local JSONL has no Hub id
    result = card.data.eval_results[0]
    assert (result.dataset_name, result.metric_type, result.metric_value) == ("arc_easy", "acc", 0.41)
    for fact in ("70,123", "70.12%", "501,760", "| learning_rate | 0.002 |", "1.8892", "33.1000",
                 "![loss curve](loss.png)", "AutoModelForCausalLM.from_pretrained", 'pipeline("text-generation"',
                 "## Limitations", "arc_easy",
                 # how a literal in a training document was treated, and what the user's eos string encodes as
                 f"a literal `{EOT}` inside a document was text, encoded as its characters",
                 "encodes `tokenizer.eos_token` in your text as the eos id"):
        assert fact in card.text, fact
    from sparknet.export import export_model

    with pytest.raises(UserError, match="is not empty: choose another OUTPUT_DIR or pass --overwrite true"):
        export_model(str(folder), out)  # never replaced silently (as the script calls it)


def test_push_is_attempted_and_fails_clearly_offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    from sparknet.export import push_to_hub

    secret = "hf_thisIsNotARealTokenButMustNotBePrinted"
    monkeypatch.setenv("HF_TOKEN", secret)
    (tmp_path / "README.md").write_text("card")
    with pytest.raises(UserError, match="cannot push to someone/sparknet-test: offline mode is on") as error:
        push_to_hub(tmp_path, "someone/sparknet-test")  # huggingface_hub refuses the create_repo call offline
    captured = capsys.readouterr()
    assert secret not in str(error.value) + captured.out + captured.err


@pytest.mark.slow
def test_a_push_the_hub_refuses_is_one_line_and_never_prints_the_token(run: tuple[Path, Path], hub: HubServer,
                                                                         tmp_path: Path) -> None:
    """Online, the token sent (HF_TOKEN, implicit tokens allowed): the loopback Hub answers the repository's
    creation with an HTTP error (it serves datasets only, so 404), which is one line naming the status, and the
    token is printed nowhere."""
    folder, tmp = run
    secret = "hf_thisIsNotARealTokenButMustNotBePrinted"
    env = hub.env(tmp_path, HF_TOKEN=secret, HF_HUB_DISABLE_IMPLICIT_TOKEN=0)
    proc = run_script("export_model.py", "--model", folder, "--output_dir", tmp / "exported", "--eval_dir",
                      tmp / "eval", "--push_to_hub", "someone/sparknet-test", env=env)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert proc.stderr.splitlines()[-1] == "error: cannot push to someone/sparknet-test (HTTP 404)", proc.stderr
    assert [(r.method, r.status) for r in hub.requests if r.path.startswith("/api/repos/create")] == [("POST", 404)]
    assert secret not in proc.stdout + proc.stderr
    assert (tmp / "exported" / "README.md").is_file()  # the folder is ready to push again


def test_not_a_run(tmp_path: Path) -> None:
    from sparknet.export import export_model

    with pytest.raises(UserError, match="is not a model folder"):
        export_model(str(tmp_path), tmp_path / "out")
    with pytest.raises(UserError, match="not a Hub id"):
        export_model("gpt2", tmp_path / "out")


def test_an_interrupted_overwrite_leaves_the_old_export_whole(run: tuple[Path, Path],
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """An overwrite whose folder differs (its card loads another repository) is killed as late as it can be while
    the old folder is in place: the new folder written in full beside it, at the rename that would move the old one
    aside. The old export is still there, byte for byte; the same command again puts the new one in place and
    leaves nothing beside it."""
    import os

    import sparknet.common.runtime as runtime_module
    import sparknet.export as export_module

    folder, tmp = run
    out = tmp / "exported"
    export_module.export_model(str(folder), out, eval_root=str(tmp / "eval"))
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    renamed = 'model_path = "someone/renamed"'
    assert renamed not in before["README.md"].decode()

    class KilledAtTheOldFolder:
        """The os module of sparknet.common.runtime, but the process dies when a rename would touch the export."""

        def __getattr__(self, name: str) -> object:
            return getattr(os, name)

        def replace(self, src: object, dst: object) -> None:
            if out in (Path(src), Path(dst)):
                beside = [p for p in tmp.glob(f".{out.name}*/README.md") if renamed in p.read_text()]
                assert beside, "killed before the new folder was written"
                raise KeyboardInterrupt
            os.replace(src, dst)

    def exchange_killed(a: Path, b: Path) -> bool:  # the atomic swap (Linux): killed before it as well
        KilledAtTheOldFolder().replace(a, b)
        return False

    monkeypatch.setattr(runtime_module, "os", KilledAtTheOldFolder())
    monkeypatch.setattr(runtime_module, "_exchange", exchange_killed)
    with pytest.raises(KeyboardInterrupt):
        export_module.export_model(str(folder), out, eval_root=str(tmp / "eval"), overwrite=True,
                                   repo_id="someone/renamed")
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    monkeypatch.undo()
    export_module.export_model(str(folder), out, eval_root=str(tmp / "eval"), overwrite=True,
                               repo_id="someone/renamed")  # the same command
    assert sorted(p.name for p in out.iterdir()) == sorted(before)
    assert renamed in (out / "README.md").read_text()
    # nothing left beside it, the one-writer lock's file included
    assert [p.name for p in tmp.glob(".exported*")] == []


def test_a_run_that_did_not_finish_is_not_exported_unless_asked(run: tuple[Path, Path]) -> None:
    folder, tmp = run
    (folder / "training_metadata.json").unlink()  # stopped while writing the final model
    (folder / "run_config.json").write_text("{}")
    from sparknet.export import export_model  # as export_model.py calls it, --unfinished as `unfinished`

    with pytest.raises(UserError, match="its training did not finish .*--unfinished true"):
        export_model(str(folder), tmp / "a", eval_root=str(tmp / "eval"))
    assert (export_model(str(folder), tmp / "a", eval_root=str(tmp / "eval"), unfinished=True)).is_file()
    _assert_exported_as_it_is(folder, tmp / "a")


def _assert_exported_as_it_is(folder: Path, out: Path) -> None:
    """`out` holds the folder's model, weight for weight, with its tokenizer, and a card that says the training
    record is missing while it keeps the evaluation's results."""
    from safetensors.numpy import load_file
    from transformers import AutoModelForCausalLM

    assert sorted(p.name for p in out.iterdir()) == ["README.md", "config.json", "generation_config.json", "loss.png",
                                                      "model.safetensors", "tokenizer.json", "tokenizer_config.json"]
    saved, exported = load_file(folder / "model.safetensors"), load_file(out / "model.safetensors")
    assert saved.keys() == exported.keys() and all((saved[k] == exported[k]).all() for k in saved)
    assert (out / "tokenizer.json").read_bytes() == (folder / "tokenizer.json").read_bytes()
    AutoModelForCausalLM.from_pretrained(str(out))
    card = (out / "README.md").read_text()
    assert "No training_metadata.json was found for this model." in card
    assert "33.1000" in card and "arc_easy" in card  # the evaluations of the run folder


@pytest.mark.slow
def test_results_written_before_they_were_kept_per_setting_are_refused_in_one_line(run: tuple[Path, Path]) -> None:
    folder, tmp = run
    old = tmp / "eval" / "myrun" / "benchmarks.json"
    old.write_text(json.dumps({"results": {"arc_easy": {"acc": 0.41, "acc_stderr": 0.01}}}))
    proc = run_script("export_model.py", "--model", folder, "--output_dir", tmp / "a", "--eval_dir", tmp / "eval")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert f"{old} keeps results without the settings they were computed with" in proc.stderr
    assert not (tmp / "a").exists()


def test_a_checkpoint_exports_with_the_config_of_the_final_export(finished, tmp_path: Path) -> None:
    """The Trainer saves checkpoints with use_cache false (it trains without the KV cache) and no pad token; an
    export of a checkpoint-N (e.g. while the run still trains) gets the same config and generation config as the
    run's final model: KV cache on, <|endoftext|> as the pad token."""
    from sparknet.export import export_model
    from sparknet.run_files import checkpoint_step

    result, _ = finished
    checkpoint = min(result.run_dir.glob("checkpoint-*"), key=lambda p: checkpoint_step(p) or 0)
    saved = json.loads((checkpoint / "config.json").read_text())
    assert saved["use_cache"] is False and saved.get("pad_token_id") is None  # as the Trainer saved it
    for name, source in (("final", result.run_dir), ("checkpoint", checkpoint)):
        export_model(str(source), tmp_path / name, eval_root=str(tmp_path / "eval"))
    for file in ("config.json", "generation_config.json"):
        final, exported = (json.loads((tmp_path / name / file).read_text()) for name in ("final", "checkpoint"))
        assert exported == final, file
    config = json.loads((tmp_path / "checkpoint" / "config.json").read_text())
    assert config["use_cache"] is True and config["pad_token_id"] == config["eos_token_id"]
    # the card says whose weights these are: this checkpoint's, not those of the model the run ended with, whose
    # final metrics it shows
    step, steps, best = checkpoint_step(checkpoint), result.metadata["steps"], _best_of(result.run_dir)
    assert step != steps
    card = (tmp_path / "checkpoint" / "README.md").read_text()
    assert (f"Weights: the run's checkpoint-{step} (step {step} of {steps}), exported as it is, not the model the "
            f"run ended with (checkpoint-{best}, the lowest eval loss): the final metrics below are that model's, not "
            "these weights'.") in card, card
    assert f"Weights: checkpoint-{best} (step {best} of {steps})" in (tmp_path / "final" / "README.md").read_text()


def _snippet(card: str) -> str:
    """The card's "How to use" code block."""
    return card.split("## How to use")[1].split("```python\n")[1].split("```")[0]


def _run_snippet(code: str, cwd: Path) -> subprocess.CompletedProcess:
    import os
    import sys

    from tests.helpers import OFFLINE_ENV

    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env={**os.environ, **OFFLINE_ENV},
                          capture_output=True, text=True, timeout=120)


@pytest.mark.slow
def test_the_cards_snippet_loads_the_folder_where_it_was_exported_and_names_the_hub_line(finished,
                                                                                         tmp_path: Path) -> None:
    """The usage example runs as it is, offline, from the project root (an export inside the project: where the
    user ran the export) or from the folder that holds it (an export elsewhere); its local path can never be taken
    for a Hub id (which is what made it wait for the Hub); the Hub line is there as a comment until the repository
    is known, then it is the line that runs."""
    import time
    import uuid

    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    from sparknet.common.runtime import PROJECT_ROOT
    from sparknet.export import export_model

    folder, tmp = finished[0].run_dir, tmp_path  # a real run: its context fits the example's 40 new tokens
    inside = PROJECT_ROOT / f"test-exports-{uuid.uuid4().hex[:8]}"
    try:
        for out, cwd in ((inside / "mine-tiny", PROJECT_ROOT), (tmp / "elsewhere" / "mine-tiny", tmp / "elsewhere")):
            code = _snippet(export_model(str(folder), out, eval_root=str(tmp / "eval")).read_text())
            local = re.search(r'^model_path = "([^"]+)"', code, re.MULTILINE).group(1)
            assert (cwd / local).resolve() == out.resolve(), code
            with pytest.raises(HFValidationError):
                validate_repo_id(local)  # transformers takes it for a path, never asks the Hub
            assert '# model_path = "your-name/mine-tiny"' in code, code  # the Hub's line, said which it is
            started = time.monotonic()
            proc = _run_snippet(code, cwd)
            assert proc.returncode == 0, proc.stderr[-3000:]
            assert time.monotonic() - started < 60
    finally:
        shutil.rmtree(inside, ignore_errors=True)
    pushed = _snippet(export_model(str(folder), tmp / "pushed", eval_root=str(tmp / "eval"),
                                   repo_id="someone/mine-tiny").read_text())
    assert re.search(r'^model_path = "someone/mine-tiny"', pushed, re.MULTILINE), pushed
    assert '# model_path = "./pushed"' in pushed, pushed


def test_no_absolute_local_path_goes_into_the_card(finished, tmp_path: Path,
                                                   tmp_path_factory: pytest.TempPathFactory) -> None:
    """A real run's card (its mix config, tokenizer and dataset recorded with absolute paths, evaluated on its own
    held-out data by absolute path): no absolute path of this machine appears in it; paths inside the project are
    relative to its root, others are their names."""
    import os

    from sparknet.common.runtime import PROJECT_ROOT
    from sparknet.eval.data import DataRequest
    from sparknet.eval.perplexity import evaluate_perplexity
    from sparknet.export import export_model

    result, _ = finished
    evaluate_perplexity([str(result.run_dir)], DataRequest(""), context=64, eval_root=str(tmp_path / "eval"))
    card = export_model(str(result.run_dir), tmp_path / "out", eval_root=str(tmp_path / "eval")).read_text()
    recorded = json.loads((result.run_dir / "training_metadata.json").read_text())
    config, dataset = Path(recorded["config"]["path"]), Path(recorded["dataset"]["path"])
    assert config.is_absolute() and dataset.is_absolute()  # what the card must not copy
    for absolute in (str(tmp_path_factory.getbasetemp()), str(tmp_path), str(PROJECT_ROOT)):
        assert absolute not in card, absolute
    # the sources as the run read them: the column recorded by the build, and the data seed beside the training one
    assert re.search(r"\| prose \| local JSONL \| `[^`]*prose\.train\.jsonl` \| `text` \|", card), card
    seed = recorded["dataset"]["inputs"]["seed"]
    assert f"| data seed (each source's shuffle and the validation hold-out) | {seed} |" in card
    # the run folder's and its checkpoints' weights as the umask makes files (safetensors alone writes 0600)
    mask = os.umask(0)
    os.umask(mask)
    for weights in [result.run_dir / "model.safetensors", *result.run_dir.glob("checkpoint-*/model.safetensors")]:
        assert weights.stat().st_mode & 0o777 == 0o666 & ~mask, weights
    assert f"Mix config: `{config.name}`" in card
    # the final metrics name the packed dataset's validation split and its size, as its manifest records them
    val = json.loads((dataset / "manifest.json").read_text())["splits"]["val"]
    cut = sum(source["documents_cut"] for source in val["sources"].values())
    assert (f"The eval figures are on the dataset's validation split: {val['blocks']:,} blocks, {val['tokens']:,} "
            f"tokens, from {val['documents']:,} documents ({cut:,} of them only their start") in card, card
    assert f"From the packed dataset `{dataset.name}` (scripts/build_dataset_v5.py)" in card
    assert "Streamed" not in card and "own hold-out" not in card
    assert f"| {dataset.name} (val) |" in card.split("## Evaluation")[1]  # the packed dataset's split


def test_the_license_is_other_with_a_warning_until_it_is_set(run: tuple[Path, Path],
                                                             caplog: pytest.LogCaptureFixture) -> None:
    """No licence is assumed (the training data's decides it): unset, the card says `license: other` and the
    export warns, naming LICENSE; set, it is the card's (through the script's flag: test_export_folder_and_card)."""
    from huggingface_hub import ModelCard

    from sparknet.export import export_model

    folder, tmp = run
    with caplog.at_level("WARNING", logger="sparknet"):
        card = export_model(str(folder), tmp / "a", eval_root=str(tmp / "eval"))
    assert ModelCard.load(card).data.license == "other"
    assert "LICENSE is not set" in caplog.text and "--license" in caplog.text, caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="sparknet"):
        card = export_model(str(folder), tmp / "b", eval_root=str(tmp / "eval"), license="gpl-3.0",
                            language=["en", "fr"])
    assert ModelCard.load(card).data.license == "gpl-3.0"
    assert ModelCard.load(card).data.language == ["en", "fr"]  # LANGUAGE, as the exporter states it
    assert "LICENSE" not in caplog.text


@pytest.mark.slow
def test_an_overwrite_under_a_file_size_limit_is_one_line_and_leaves_the_old_export(run: tuple[Path, Path]) -> None:
    """`ulimit -f` below the weights' size: a 19-line SafetensorError, and .exported.building left behind. Now one
    line naming the file and what EFBIG means, nothing left beside the folder, the old export byte for byte."""
    from sparknet.export import export_model

    folder, tmp = run
    out = tmp / "exported"
    args = ["--model", folder, "--output_dir", out, "--eval_dir", tmp / "eval"]
    export_model(str(folder), out, eval_root=str(tmp / "eval"))
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    limit = len(before["model.safetensors"]) // 2
    proc = run_script("export_model.py", *args, "--overwrite", "true", "--license", "mit", file_size_limit=limit)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert errors == [f"error: cannot write {tmp / '.exported.building' / 'model.safetensors'}: File too large "
                      "(EFBIG): the file size limit (`ulimit -f`) or the file system's largest file is reached: raise "
                      "the limit, or write elsewhere; then run the same command again"], proc.stderr[-3000:]
    assert [p.name for p in tmp.glob(".exported*")] == []  # no lock file left either
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_a_license_that_is_not_a_hub_id_is_refused_with_the_nearest(tmp_path: Path) -> None:
    """The card's `license:` is what the Hub indexes: a misspelt id, or one that smuggles a second YAML key, is one
    line naming the nearest Hub id, before any work (nothing is written)."""
    for given, nearest in (("not-a-license", "unlicense"), ("mit\nx: y", "mit"), ("Apache-2", "apache-2.0")):
        proc = run_script("export_model.py", "--model", tmp_path / "run", "--output_dir", tmp_path / "out",
                          "--license", given)
        assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
        line = proc.stderr.strip().splitlines()[-1]
        assert f"LICENSE={given!r}: expected a Hub licence id" in line and f"did you mean {nearest}?" in line, line
    assert not (tmp_path / "out").exists()
    from sparknet.export import export_model

    with pytest.raises(UserError, match="did you mean mit"):
        export_model(str(tmp_path / "run"), tmp_path / "out", license="MIT")


ANNEALED = {
    "run_name": "own-anneal",
    "settings": {"optimizer": "adamw", "learning_rate": 0.002, "muon_learning_rate": 0.001, "weight_decay": 0.1,
                 "adam_betas": [0.9, 0.95], "lr_schedule": "wsd", "warmup_ratio": 0.02, "min_lr_ratio": 0.1,
                 "seed": 42},
    "config": {"path": "configs/own.json", "seed": 7, "phases": [
        {"name": "main", "share": 0.8, "probs": {"manuals": 0.7, "code": 0.3}},
        {"name": "anneal", "share": 0.2, "probs": {"notes": 1.0}}],
        "mix": [{"name": "csv", "data_files": "data/manuals.csv", "text_field": None, "label": "manuals"},
                {"name": "parquet", "data_files": ["/elsewhere/code.parquet"], "text_field": "content",
                 "label": "code"},
                {"name": "text", "data_files": "data/notes/*.txt", "text_field": None, "label": "notes"},
                {"name": "someone/web", "subset": "en", "split": "train", "revision": "v1", "text_field": None,
                 "label": "web/en@v1"}]},
    "source_revisions": {"web/en@v1": {"revision": "v1", "commit": "0123456789abcdef0123456789abcdef01234567"}},
    "text_columns": {"manuals": "text", "code": "content", "notes": "text", "web/en@v1": "raw_content"},
    "dataset": {"inputs": {"seed": 7}, "realised_mixture": {"train": {
        "manuals": {"tokens": 500, "documents": 5, "share": 0.5, "requested_share": 0.56},
        "code": {"tokens": 240, "documents": 2, "share": 0.24, "requested_share": 0.24},
        "notes": {"tokens": 200, "documents": 4, "share": 0.2, "requested_share": 0.2},
        "web/en@v1": {"tokens": 60, "documents": 1, "share": 0.06, "requested_share": 0.0}}}},
    "phases": [{"name": "main", "steps": [1, 400], "blocks": [0, 6400]},
               {"name": "anneal", "steps": [401, 500], "blocks": [6400, 8000]}],
    "base_model": {"init_from": "checkpoints/own-tiny", "name": "own-tiny", "commit": None,
                   "sha256": "ab" * 32, "step": None},
    "steps": 500,
    "metrics": {"eval_loss": 5.0, "eval_per_source": {"manuals": {"loss": 4.5, "tokens": 1270, "bits_per_byte": 2.1}},
                "best_checkpoint": "/elsewhere/checkpoints/own-anneal/checkpoint-400"},
}


def test_the_card_of_an_annealed_run_tells_the_whole_story(run: tuple[Path, Path]) -> None:
    """An annealed run's card: its phases (mix and steps) and LR schedule as steps, a local base named in the text
    with its weights' sha256 and never as the Hub's `base_model`, both seeds named for what they seed, only the
    optimizer's own settings, each source described (kind, files or Hub id at its commit, the column read, the
    realised share), eval_perplexity's per-source rows; and every file of the folder as the umask makes files."""
    import os

    from huggingface_hub import ModelCard

    from sparknet.export import export_model

    folder, tmp = run
    (folder / "training_metadata.json").write_text(json.dumps(ANNEALED))
    (tmp / "eval" / "myrun" / "perplexity.json").write_text(json.dumps({"ds": {
        "data": "datasets/own", "split": "val", "documents": 9, "tokens": 2988, "nll": 5.0, "perplexity": 148.4,
        "bits_per_byte": 2.0, "sources": {"manuals": {"documents": 5, "tokens": 2000, "nll": 4.9, "perplexity": 134.3,
                                                      "bits_per_byte": 1.9}}},
        "odd": {"data": "notes\nof 2026.jsonl", "documents": 2, "tokens": 40, "nll": 5.5}}))  # a newline in a name
    card_file = export_model(str(folder), tmp / "out", eval_root=str(tmp / "eval"))
    card = ModelCard.load(card_file)
    assert "base_model" not in card.data.to_dict()  # a local run's name is no Hub repository id
    text = card.text
    assert f"from a local model (run `own-tiny`; weights sha256 `{'ab' * 32}`, not on the Hub)" in text
    assert "| main | 80% | 1-400 | manuals 70%, code 30% |" in text
    assert "| anneal | 20% | 401-500 | notes 100% |" in text
    assert ("| lr schedule | wsd: linear warmup over steps 1-10, then 0.002 held to step 400, then a linear decay to "
            "0.1 x 0.002 over steps 401-500 (the last phase) |") in text
    assert "| training seed (SEED: initialisation, dropout, the order blocks are drawn in) | 42 |" in text
    assert "| data seed (each source's shuffle and the validation hold-out) | 7 |" in text
    assert "muon_learning_rate" not in text and "| learning_rate | 0.002 |" in text
    assert "| manuals | local CSV (with a header row) | `data/manuals.csv` | `text` | 500 | 5 | 50.00% | 56.00% |" \
        in text
    assert "| code | local Parquet | `code.parquet` | `content` |" in text  # outside the project: its name
    assert "| notes | local plain-text (one document per file) | `data/notes/*.txt` | `text` |" in text
    assert ("| web/en@v1 | Hub dataset | `someone/web`, subset `en`, split `train`, revision `v1`, commit "
            "`0123456789abcdef0123456789abcdef01234567` | `raw_content` |") in text
    assert "| manuals | 1,270 | 4.5000 |" in text  # the trainer's per-source eval, its tokens named
    # the run ended with its best checkpoint, not its last step's (named, not by this machine's path)
    assert ("Weights: checkpoint-400 (step 400 of 500), not the last step's: the checkpoint with the lowest eval "
            "loss (the run ends with its best checkpoint by eval loss: load_best_model_at_end).") in text
    assert "/elsewhere" not in text
    # a packed dataset's validation split, its size not recorded in this metadata: not made up
    assert "The eval figures are on the run's validation blocks (their size is not recorded)." in text
    assert "| datasets/own (val) | 9 | 2,988 |" in text and "| datasets/own (val) [manuals] | 5 | 2,000 |" in text
    # the two token counts of one validation split, each labelled with what it counts (issue 43.4)
    assert "| source | predicted tokens | loss |" in text and "every token of a block but its first" in text
    assert "| data | documents | tokens scored |" in text and "each predicted from those before it" in text
    assert "| notes\\nof 2026.jsonl | 2 | 40 |" in text  # escaped: the row stays one line
    mask = os.umask(0)
    os.umask(mask)
    mode = 0o666 & ~mask  # safetensors alone would write 0600
    assert {p.name: oct(p.stat().st_mode & 0o777) for p in (tmp / "out").iterdir()} == {
        p.name: oct(mode) for p in (tmp / "out").iterdir()}
    # a Hub base is the Hub's base_model, named at its commit
    hub_base = {**ANNEALED, "base_model": {"init_from": "someone/base", "name": "someone/base", "commit": "c" * 40,
                                           "sha256": None, "step": None}, "settings": {
        **ANNEALED["settings"], "optimizer": "muon", "lr_schedule": "cosine"}}
    (folder / "training_metadata.json").write_text(json.dumps(hub_base))
    card = ModelCard.load(export_model(str(folder), tmp / "hub", eval_root=str(tmp / "eval")))
    assert card.data.to_dict()["base_model"] == "someone/base"
    assert f"trained further from the Hub model `someone/base` at commit `{'c' * 40}`" in card.text
    assert "| muon_learning_rate | 0.001 |" in card.text
    assert "| lr schedule | cosine: linear warmup over steps 1-10, then a cosine decay from 0.002 to 0.1 x 0.002 at " \
           "step 500 |" in card.text


def _card_sources(card: str) -> dict[str, tuple[int, int]]:
    """The "Training data" table's tokens and documents per source, as the card prints them."""
    table = card.split("## Training data")[1].split("\n\n")[1]
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in table.splitlines()[2:]]
    return {row[0]: (int(row[4].replace(",", "")), int(row[5].replace(",", ""))) for row in rows}


def _best_of(run_dir: Path) -> int:
    """The step of the run's best checkpoint, as the Trainer recorded it in its last checkpoint (not the metadata)."""
    from sparknet.run_files import checkpoint_step, checkpoints_by_step

    state = json.loads((checkpoints_by_step(run_dir)[-1] / "trainer_state.json").read_text())
    return checkpoint_step(Path(state["best_model_checkpoint"]))


def _assert_validation_told(card: str, run_dir: Path) -> None:
    """The card names the run's own hold-out, never a dataset's split, with its size as the run folder holds it:
    val_blocks.npy's blocks and tokens, the items val_report.json records, the tokens the loss averages."""
    import numpy as np

    blocks, block_size = np.load(run_dir / "val_blocks.npy").shape
    items = len(json.loads((run_dir / "val_report.json").read_text())["item_starts"])
    assert (f"The eval figures are on the run's own validation hold-out: {blocks:,} blocks, {blocks * block_size:,} "
            f"tokens, from {items:,} documents") in card, card
    assert f"The eval loss averages the {blocks * (block_size - 1):,} tokens they predict" in card
    assert "the dataset's validation split" not in card
    assert "Its validation blocks are its own hold-out, not a dataset's split" in card


def test_a_streamed_runs_card_says_it_was_streamed_and_what_its_weights_and_metrics_are(
        corpus_config: Path, tokenizer_dir: Path, tmp_path: Path) -> None:
    """A streamed run (the streaming trainer, in this process): its card says it was streamed, with its shuffle
    buffer and window, that its validation is its own hold-out (of the size its run folder holds), which checkpoint
    the weights are (the Trainer's record of the best), and states no language."""
    from huggingface_hub import ModelCard

    from sparknet.config.cli import script_constants
    from sparknet.export import export_model
    from tests.helpers import STREAM, train_streamed

    result = train_streamed(tmp_path, corpus_config, tokenizer_dir)
    assert result.status == "finished"
    card = ModelCard.load(export_model(str(result.run_dir), tmp_path / "out", eval_root=str(tmp_path / "eval")))
    assert "language" not in card.data.to_dict()  # nothing asserted of a corpus of prose and code
    text = card.text
    window = script_constants("train_sparknet.py")["SHUFFLE_WINDOW"]
    assert (f"Streamed: the sources were read, encoded and mixed while the model trained (scripts/train_sparknet.py), "
            f"not read from a packed dataset; each source's documents shuffled in a buffer of "
            f"{STREAM['shuffle_buffer']} documents, the training blocks handed out in a seeded order within windows "
            f"of at most {window:,} blocks per process.") in text, text
    assert "processes" not in text.split("## Training data")[1].split("## Training")[0]  # one process
    _assert_validation_told(text, result.run_dir)
    steps, best = result.metadata["steps"], _best_of(result.run_dir)
    last = ("the last step's, which had the lowest eval loss of the checkpoints evaluated" if best == steps else
            "not the last step's: the checkpoint with the lowest eval loss")
    assert f"Weights: checkpoint-{best} (step {best:,} of {steps:,}), {last}" in text, text
    # the stream's blocks are ordered in windows by the data seed, not SEED
    assert "| training seed (SEED: initialisation, dropout) |" in text
    identity = json.loads((result.run_dir / "run_config.json").read_text())
    trained = steps * identity["global_batch_size"] * identity["block_size"]
    assert sum(tokens for tokens, _ in _card_sources(text).values()) == trained == 40 * 4 * 128


@pytest.mark.slow
def test_two_processes_card_counts_every_process_stream(corpus_config: Path, tokenizer_dir: Path,
                                                         tmp_path: Path) -> None:
    """A streamed run on two processes (torchrun, as users run it) exported by the script: the "Training data"
    table counts both processes' streams, its tokens the run's steps x global batch x block size (the Trainer's
    and run_config.json's record, not the metadata's) split by source; its blocks too; and the rest of the card as
    on one process."""
    from huggingface_hub import ModelCard

    from tests.helpers import finish_ok, split_in_two_files, start_script, stream_args

    config = split_in_two_files(corpus_config, tmp_path)
    args = stream_args(tmp_path, config, tokenizer_dir, target_tokens=20 * 8 * 128, global_batch_size=8,
                       eval_steps=5, save_steps=10, logging_steps=1000, num_workers=1)
    finish_ok(start_script("train_sparknet.py", args, processes=2))
    run_dir = tmp_path / "ckpt" / "run"
    proc = run_script("export_model.py", "--model", run_dir, "--output_dir", tmp_path / "out", "--eval_dir",
                      tmp_path / "eval")
    assert proc.returncode == 0, proc.stderr[-3000:]
    card = ModelCard.load(tmp_path / "out" / "README.md")
    identity = json.loads((run_dir / "run_config.json").read_text())
    state = json.loads((run_dir / "checkpoint-20" / "trainer_state.json").read_text())
    trained = state["global_step"] * identity["global_batch_size"] * identity["block_size"]
    assert trained == 20 * 8 * 128
    sources = _card_sources(card.text)
    assert sum(tokens for tokens, _ in sources.values()) == trained, sources  # rank 0's alone was half
    assert abs(sources["prose"][0] / trained - 0.6) < 0.05 and abs(sources["code"][0] / trained - 0.4) < 0.05
    training = json.loads((run_dir / "training_metadata.json").read_text())["stream"]["training"]
    assert training["blocks"] == state["global_step"] * identity["global_batch_size"] and training["processes"] == 2
    assert "It ran on 2 processes, each reading its own documents of each source: the table counts all of them." \
        in card.text
    assert "language" not in card.data.to_dict()
    _assert_validation_told(card.text, run_dir)
    assert f"Weights: checkpoint-{_best_of(run_dir)} (step {_best_of(run_dir)} of 20)" in card.text


def test_the_processes_counts_combine_into_the_runs() -> None:
    """Each process's stream figures, summed where they count the run's training (tokens, documents, repeats
    removed, blocks; the shares from the summed tokens), a dry source where any process saw it dry, the most
    restarts any process made, the first end."""
    from sparknet.train.stream_plan import combine_counts

    rank0 = {"tokens": {"a": 600, "b": 424}, "documents": {"a": 5, "b": 3}, "validation_repeats_removed": {"a": 1,
             "b": 0}, "blocks": 8, "restarts": {"a": 0, "b": 2}, "exhausted": ["b"], "end": None,
             "shares": {"a": 600 / 1024, "b": 424 / 1024}}
    rank1 = {"tokens": {"a": 700, "b": 324}, "documents": {"a": 6, "b": 2}, "validation_repeats_removed": {"a": 0,
             "b": 2}, "blocks": 8, "restarts": {"a": 1, "b": 0}, "exhausted": ["a"], "end": "every source ran dry",
             "shares": {"a": 700 / 1024, "b": 324 / 1024}}
    assert combine_counts([rank0, rank1]) == {
        "tokens": {"a": 1300, "b": 748}, "documents": {"a": 11, "b": 5}, "validation_repeats_removed": {"a": 1, "b": 2},
        "shares": {"a": 1300 / 2048, "b": 748 / 2048}, "blocks": 16, "restarts": {"a": 1, "b": 2},
        "exhausted": ["a", "b"], "end": "every source ran dry"}
    assert combine_counts([rank0]) == {**rank0, "exhausted": ["b"]}


def test_an_older_multi_process_runs_card_says_its_table_is_one_process(run: tuple[Path, Path]) -> None:
    """Metadata written before the stream's counts were summed over processes (no `processes`) on two processes:
    the card says its table is process 0's stream alone, and the run's tokens in all; its shuffle settings, not
    recorded then, are said to be unknown."""
    from sparknet.export import export_model

    folder, tmp = run
    old = {**{k: v for k, v in METADATA.items() if k != "dataset"}, "world_size": 2, "stream": {
        "data_seed": 1, "validation": {"blocks": 2, "tokens": 256, "sources": {
            "fineweb-edu": {"tokens": 200, "documents": 3, "documents_cut": 1},
            "local": {"tokens": 56, "documents": 1, "documents_cut": 0}}},
        "training": {"shares": {"fineweb-edu": 0.7, "local": 0.3}, "tokens": {"fineweb-edu": 700, "local": 300},
                     "documents": {"fineweb-edu": 4, "local": 2}, "requested_shares": {"fineweb-edu": 0.7,
                                                                                       "local": 0.3}}}}
    (folder / "training_metadata.json").write_text(json.dumps(old))
    card = export_model(str(folder), tmp / "out", eval_root=str(tmp / "eval")).read_text()
    assert ("It ran on 2 processes, each reading its own documents of each source; the table's tokens and documents "
            "are process 0's stream alone (this run's metadata was written before they were summed over processes): "
            "the run trained on 501,760 tokens in all.") in card, card
    assert "its shuffle buffer and window are not recorded in this run's metadata" in card
    assert ("on the run's own validation hold-out: 2 blocks, 256 tokens, from 4 documents (1 of them only their "
            "start, cut at their source's cap; training took the rest of those). The eval loss averages the 254 "
            "tokens they predict") in card
