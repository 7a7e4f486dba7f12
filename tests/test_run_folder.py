"""The resume point: only checkpoints whose completion marker vouches for every file they must hold."""

from __future__ import annotations

import json
from pathlib import Path

from sparknet.train.folders import COMPLETE_MARKER, latest_complete_checkpoint, mark_complete


def _checkpoint(run_dir: Path, step: int, files: tuple[str, ...] = ("model.safetensors", "rng_state_0.pth",
                                                                   "rng_state_1.pth")) -> Path:
    folder = run_dir / f"checkpoint-{step}"
    folder.mkdir(parents=True)
    for name in files:
        (folder / name).write_bytes(b"x" * (len(name) + step))
    return folder


def test_a_checkpoint_that_lost_a_listed_file_is_skipped(tmp_path: Path) -> None:
    good = _checkpoint(tmp_path, 10)
    mark_complete(good, 10)
    later = _checkpoint(tmp_path, 20)
    mark_complete(later, 20)
    (later / "rng_state_1.pth").unlink()  # e.g. another rank had not written its part when the marker was written
    truncated = _checkpoint(tmp_path, 30)
    mark_complete(truncated, 30)
    (truncated / "model.safetensors").write_bytes(b"short")
    unmarked = _checkpoint(tmp_path, 40)
    assert not (unmarked / COMPLETE_MARKER).exists()
    assert latest_complete_checkpoint(tmp_path) == good
    assert set(json.loads((good / COMPLETE_MARKER).read_text())["files"]) == {
        "model.safetensors", "rng_state_0.pth", "rng_state_1.pth"}


def test_a_marker_that_does_not_list_every_file_with_its_checksum_is_not_trusted(tmp_path: Path) -> None:
    """A marker without a file list, or listing sizes without sha256s, vouches for nothing (damaged): the checkpoint
    is skipped, saying why."""
    from sparknet.train.folders import incomplete

    folder = _checkpoint(tmp_path, 5)
    (folder / COMPLETE_MARKER).write_text("5\n")
    assert latest_complete_checkpoint(tmp_path) is None
    mark_complete(folder, 5)
    assert latest_complete_checkpoint(tmp_path) == folder
    marker = json.loads((folder / COMPLETE_MARKER).read_text())
    sizes = {name: entry["size"] for name, entry in marker["files"].items()}
    (folder / COMPLETE_MARKER).write_text(json.dumps({"step": 5, "files": sizes}))
    assert latest_complete_checkpoint(tmp_path, verify=True) is None
    assert incomplete(folder) == f"its {COMPLETE_MARKER} marker does not list the files with their sizes and " \
                                 "sha256s (damaged)"


def test_one_reader_of_a_runs_metadata_for_run_and_checkpoint_folders(tmp_path: Path) -> None:
    import json

    import pytest

    from sparknet.common.errors import UserError
    from sparknet.run_files import METADATA, RUN_CONFIG, read_metadata, run_of

    run = tmp_path / "run"
    (run / "checkpoint-20").mkdir(parents=True)
    (run / RUN_CONFIG).write_text("{}")
    assert read_metadata(run) is None and read_metadata(run / "checkpoint-20") is None  # not finished
    (run / METADATA).write_text(json.dumps({"steps": 40}))
    assert run_of(run / "checkpoint-20") == run and run_of(run) == run
    assert read_metadata(run / "checkpoint-20") == read_metadata(run) == {"steps": 40}
    (run / METADATA).write_text('{"steps": 4')  # damaged
    with pytest.raises(UserError, match=r"training_metadata.json is not valid JSON .*rerun the training command"):
        read_metadata(run / "checkpoint-20")


def test_damaged_state_files_are_named_before_training(tmp_path: Path, caplog) -> None:
    import pytest

    from sparknet.common.errors import UserError
    from sparknet.run_files import RUN_CONFIG
    from sparknet.train.folders import EVAL_START, RUN_FORMAT, open_run

    run = tmp_path / "ckpt" / "run"
    run.mkdir(parents=True)
    (run / RUN_CONFIG).write_text('{"seed": 4')  # cut short by a full disk
    with pytest.raises(UserError, match=r"run_config.json is damaged .*another RUN_NAME"):
        open_run("run", str(tmp_path / "ckpt"), str(tmp_path / "logs"), {"seed": 4}, False, True)
    (run / RUN_CONFIG).write_text(f'{{"format_version": {RUN_FORMAT}, "seed": 4}}')
    (run / EVAL_START).write_text("\x00\x00\x00")  # same size as before, garbage
    folder = open_run("run", str(tmp_path / "ckpt"), str(tmp_path / "logs"), {"seed": 4}, False, True)
    assert "eval_start.json is damaged" in caplog.text
    assert folder.initial_eval() is None  # the metadata is written without it, hours later, without a crash


def test_changes_are_named_by_the_path_to_the_leaf_that_differs_with_the_difference_shown() -> None:
    from sparknet.config.identity import describe_changes

    sha_a, sha_b = "ab" * 32, "ab" * 30 + "cdcd"
    old = {"lr": 0.003, "dataset_inputs": {"mix": [{"prob": 0.6}, {"prob": 0.4}], "seed": 1,
                                           "local_files_sha256": {"/data/a.jsonl": sha_a, "/data/b.jsonl": sha_b}}}
    new = {"lr": 0.003, "dataset_inputs": {"mix": [{"prob": 0.5}, {"prob": 0.4}], "seed": 1, "added": True,
                                           "local_files_sha256": {"/data/a.jsonl": sha_b, "/data/b.jsonl": sha_b}}}
    changes = describe_changes(old, new, upper=True)
    assert changes[0] == "DATASET_INPUTS.added: null -> true"
    assert changes[1].startswith("DATASET_INPUTS.local_files_sha256./data/a.jsonl: ")
    assert changes[2] == "DATASET_INPUTS.mix[0].prob: 0.6 -> 0.5"
    assert len(changes) == 3
    text = "a" * 200 + "OLD" + "z" * 200
    (change,) = describe_changes({"note": text}, {"note": text.replace("OLD", "NEW")}, limit=40)
    before, after = change.removeprefix("note: ").split(" -> ")
    assert "OLD" in before and "NEW" in after and len(before) <= 40 and len(after) <= 40
