"""A run's folders: `checkpoints/<RUN_NAME>/` (identity, checkpoints, samples, final model, metadata) and
`logs/<RUN_NAME>/` (TensorBoard), the guard against reusing a RUN_NAME with other settings, and the resume point.

A checkpoint counts only once its completion marker is written, and the marker lists every file the checkpoint
must hold (each rank's RNG state included, sub-folders too) with its size and sha256, so a checkpoint that lost a
file, whose marker was written before another rank finished, or whose bytes were damaged since, is skipped on
resume, naming the file, and the run goes on from the checkpoint before it.
"""

from __future__ import annotations

import json
import logging
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sparknet.common.errors import UserError
from sparknet.common.outputs import Output
from sparknet.common.runtime import file_sha256, project_path, read_json_object, write_json_atomic
from sparknet.config.identity import describe_changes
from sparknet.run_files import METADATA, RUN_CONFIG, checkpoint_step, checkpoints_by_step

log = logging.getLogger("sparknet.train")
# The run folder's format, recorded in its run_config.json: a folder in another format is refused in one line, never
# migrated (1: before format versions were recorded; 3: the stream holds out in the sources' order and trains on the
# rest of what it cut, its position in a new format; 4: DOCUMENT_MASKING, a tie in bench/recipe.py, left the
# settings).
RUN_FORMAT = 4
EVAL_START = "eval_start.json"
COMPLETE_MARKER = ".complete"


def _checkpoint_files(folder: Path) -> list[Path]:
    """Every file of a checkpoint, in sub-folders too (FSDP's sharded state), the marker aside."""
    return sorted(p for p in folder.rglob("*") if p.is_file() and p.name != COMPLETE_MARKER)


def mark_complete(folder: Path, step: int) -> None:
    """Writes the completion marker: every file of the checkpoint with its size and sha256 as they are now (about
    0.5 s per GB; bench/checkpoint_checksum.py), so that damage that keeps a file's size is found on resume."""
    files = {p.relative_to(folder).as_posix(): {"size": p.stat().st_size, "sha256": file_sha256(p)}
             for p in _checkpoint_files(folder)}
    write_json_atomic(folder / COMPLETE_MARKER, {"step": step, "files": files})


def _marker_files(folder: Path) -> dict[str, dict[str, Any]] | None:
    """The files the checkpoint's marker lists, each with its size and sha256; None without a marker, or with one
    that does not list them so (damaged)."""
    try:
        files = json.loads((folder / COMPLETE_MARKER).read_text())["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    listed = isinstance(files, dict) and all(
        isinstance(entry, dict) and isinstance(entry.get("size"), int) and isinstance(entry.get("sha256"), str)
        for entry in files.values())
    return files if listed else None


def incomplete(folder: Path) -> str | None:
    """Why the checkpoint does not count (cheap: sizes only), or None when its marker vouches for every file: no
    marker (the process died while saving), or a file it lists that is gone or has another size since."""
    files = _marker_files(folder)
    if files is None and (folder / COMPLETE_MARKER).exists():  # written atomically: damaged since
        return f"its {COMPLETE_MARKER} marker does not list the files with their sizes and sha256s (damaged)"
    if files is None:
        return "it was not completely written (the process died while saving)"
    for name, entry in files.items():
        path = folder / name
        if not path.is_file():
            return f"its {name} is missing (deleted since the checkpoint was saved)"
        if path.stat().st_size != entry["size"]:
            return f"its {name} holds {path.stat().st_size:,} bytes, {entry['size']:,} were saved (cut short since)"
    return None


def damaged_file(folder: Path) -> str | None:
    """The first file of a complete checkpoint whose bytes are not those its marker recorded (same size, other
    content: a bad disk, a stray write), or None when all are."""
    for name, entry in (_marker_files(folder) or {}).items():
        try:
            if file_sha256(folder / name) != entry["sha256"]:
                return name
        except OSError:
            return name
    return None


def latest_complete_checkpoint(run_dir: Path, verify: bool = False) -> Path | None:
    """The highest-step checkpoint that was fully written; half-written ones are skipped with a warning. With
    `verify` (the resume point), every file's checksum is checked too, and a damaged checkpoint is skipped naming
    the file, so the run falls back to the one before."""
    for path in reversed(checkpoints_by_step(run_dir)):
        why = incomplete(path)
        if why is not None:
            log.warning("skipping %s: %s", path, why)
            continue
        damaged = damaged_file(path) if verify else None
        if damaged is None:
            return path
        log.warning("skipping %s: its %s is not the file that was saved (checksum mismatch: damaged on disk); "
                    "falling back to an earlier checkpoint", path, damaged)
    return None


def checkpoint_context(run_dir: Path) -> tuple[int, Path] | None:
    """The context of the model an unfinished run's checkpoints hold (the newest checkpoint's config.json), with
    that file; None for a run without one, or finished (it trains no more). The model is fixed when the run begins,
    so every checkpoint says the same."""
    if (run_dir / METADATA).is_file():
        return None
    for path in (checkpoint / "config.json" for checkpoint in reversed(checkpoints_by_step(run_dir))):
        try:
            config = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            continue  # a half-written checkpoint: an older one says the same
        context = config.get("n_positions", config.get("max_position_embeddings")) if isinstance(config, dict) else None
        if isinstance(context, int):
            return context, path
    return None


@dataclass
class RunFolder:
    """Where a run lives and where it resumes from."""

    run_dir: Path
    log_dir: Path
    resume: Path | None  # the checkpoint to resume from; None for a fresh start
    finished_metadata: dict[str, Any] | None  # set when the run already finished

    @property
    def resume_step(self) -> int:
        return checkpoint_step(self.resume) or 0 if self.resume else 0

    def initial_eval(self) -> float | None:
        """The step-0 eval loss the run recorded (eval_start.json), or None; checked by `open_run` at the start."""
        return _eval_start(self.run_dir / EVAL_START)


def _eval_start(path: Path) -> float | None:
    if not path.is_file():
        return None
    try:
        loss = json.loads(path.read_text(encoding="utf-8"))["eval_loss"]
        return float(loss)
    except (UnicodeDecodeError, ValueError, KeyError, TypeError):
        return None


def read_identity(run_dir: Path) -> dict[str, Any]:
    """The identity a run folder records (its run_config.json, the format version left out); one line when the
    folder is in another format than RUN_FORMAT, read before anything else of the folder is."""
    previous = dict(_read_state(run_dir / RUN_CONFIG))
    version = previous.pop("format_version", 1)
    if version != RUN_FORMAT:
        raise UserError(f"run {run_dir.name} is in run folder format {version}, and this SparkNet reads format "
                        f"{RUN_FORMAT}: start it again under another RUN_NAME, or finish it with the SparkNet "
                        "version that started it")
    return previous


def _read_state(path: Path) -> dict[str, Any]:
    """A run's JSON state file, or one line naming it and the fix."""
    return read_json_object(path, "it records the run's settings, compared on every resume. Restore it from a backup, "
                                  "or start again with another RUN_NAME")


def run_outputs(run_name: str, checkpoints_dir: str, logs_dir: str) -> list[Output]:
    """The run's two folders as output locations, checked before any work (sparknet.common.outputs); the run folder has
    the one-writer lock (sparknet.common.locks)."""
    return [Output("CHECKPOINTS_DIR", project_path(checkpoints_dir) / run_name, name_constant="RUN_NAME", locked=True),
            Output("LOGS_DIR", project_path(logs_dir) / run_name, name_constant="RUN_NAME")]


def open_run(run_name: str, checkpoints_dir: str, logs_dir: str, identity: dict[str, Any],
             allow_config_change: bool, main_process: bool,
             fixed: dict[str, tuple[Any, str]] | None = None) -> RunFolder:
    """Opens (or creates) the run's folders: refuses a RUN_NAME used with other settings, finds the resume point,
    and on a fresh start clears the logs of an attempt that never saved a checkpoint. `fixed` holds identity that
    no ALLOW_CONFIG_CHANGE may change ({key: (value, why and the fix)}). A refused attempt writes nothing."""
    fixed = fixed or {}
    identity = {**identity, **{key: value for key, (value, _why) in fixed.items()}}
    run_dir = project_path(checkpoints_dir) / run_name
    log_dir = project_path(logs_dir) / run_name
    resume = None
    start = run_dir / EVAL_START
    if start.is_file() and _eval_start(start) is None:  # checked now, not when the metadata is written hours later
        log.warning("%s is damaged: the step-0 eval loss is not known and is left out of the metadata", start)
        if main_process:
            start.unlink()
    if (run_dir / RUN_CONFIG).is_file():
        previous = read_identity(run_dir)
        for key, (value, why) in fixed.items():
            if key in previous and previous[key] != value:
                raise UserError(f"run {run_name}: {key.replace('_', ' ')} {previous[key]} -> {value}: {why}")
        changes = describe_changes(previous, identity, upper=True)
        finished = (run_dir / METADATA).is_file()
        if changes and finished:  # continuing it with the flag would only end in "already finished"
            raise UserError(f"run {run_name} already finished ({run_dir / METADATA}), with other settings "
                            f"({'; '.join(changes)}): choose a new RUN_NAME to train with these")
        if changes and not allow_config_change:
            raise UserError(f"run {run_name} exists with other settings ({'; '.join(changes)}). Choose a new "
                            "RUN_NAME, or pass --allow_config_change true to continue it with the new settings")
        if changes:
            log.warning("continuing run %s with changed settings (%s); the checkpoint's optimizer and LR-scheduler "
                        "state are restored as saved, so a changed peak LR does not take effect", run_name,
                        "; ".join(changes))
        if finished:
            log.info("run %s already finished (%s): choose a new RUN_NAME to train again", run_name,
                     run_dir / METADATA)
            return RunFolder(run_dir, log_dir, None, json.loads((run_dir / METADATA).read_text()))
        resume = latest_complete_checkpoint(run_dir, verify=True)
    elif main_process and run_dir.exists() and any(run_dir.iterdir()):  # other ranks may see it being created
        raise UserError(f"{run_dir} exists but is not a SparkNet run (no {RUN_CONFIG}): choose another RUN_NAME")
    if main_process:
        run_dir.mkdir(parents=True, exist_ok=True)
        if resume is None and log_dir.exists():
            shutil.rmtree(log_dir)  # a fresh start: events of an attempt that never saved a checkpoint are void
        write_json_atomic(run_dir / RUN_CONFIG, {"format_version": RUN_FORMAT, **identity})
    return RunFolder(run_dir, log_dir, resume, None)
