"""The models an evaluation takes: a run folder, a checkpoint-N inside it, or a Hub id; resolved, checked and loaded."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sparknet.common.errors import UserError
from sparknet.run_files import WEIGHT_FILES, checkpoint_step, checkpoints_by_step


@dataclass(frozen=True)
class ModelRef:
    """What the user named (`spec`), what `from_pretrained` loads (`source`), and the results folder name."""

    spec: str
    source: str
    name: str  # eval/<name>/: RUN_NAME, RUN_NAME/checkpoint-N, or the Hub id with "/" as "__"
    folder: Path | None  # None for a Hub id


def resolve_model(spec: str) -> ModelRef:
    """A model folder (relative to the project root) or a Hub id (told apart by sparknet.common.folder_or_hub's
    rule); a folder that holds no model, and a local path that is not there, are UserErrors."""
    from sparknet.common.folder_or_hub import local_path, not_found
    from sparknet.common.runtime import project_path

    # resolved: "run/checkpoint-49/..", "run/." and a symlink name the folder they lead to, whose name names its
    # results (eval/<name>/), never ".." (which put them beside EVAL_DIR)
    folder = project_path(spec).resolve()
    if folder.exists():
        if not (folder / "config.json").is_file() or not any((folder / w).is_file() for w in WEIGHT_FILES):
            checkpoints = checkpoints_by_step(folder) if folder.is_dir() else []
            held = ", ".join(c.name for c in checkpoints[-3:])
            hint = (f"; it holds {held}: pass one of those, or let the run finish" if checkpoints else
                    ": pass checkpoints/RUN_NAME of a finished run, a checkpoint-N inside it, or a Hub id such as gpt2")
            raise UserError(f"{folder} is not a model folder (no config.json and weights){hint}")
        run = folder.parent.name if folder.name.startswith("checkpoint-") else None
        return ModelRef(spec, str(folder), f"{run}/{folder.name}" if run else folder.name, folder)
    if any(checkpoint_step(Path(part)) is not None for part in Path(spec).parts):
        raise UserError(_gone(folder))  # a Trainer checkpoint's name: a local folder, whatever else the path holds
    meant = local_path(spec)  # "checkpoints/dmeo": a mistyped run, not the Hub's user "checkpoints"
    if meant is not None:
        raise UserError(f"{not_found('model folder', spec, meant)}: pass checkpoints/RUN_NAME of a finished run, a "
                        "checkpoint-N inside it, or a Hub id")
    return ModelRef(spec, spec, spec.replace("/", "__"), None)


def _gone(folder: Path) -> str:
    """A local model folder that is not there: for a checkpoint-N, most likely removed by its run's rotation."""
    if checkpoint_step(folder) is None:
        return f"{folder} no longer exists: evaluate another model folder"
    if not folder.parent.is_dir():  # no run folder either: a mistyped path, not a rotated checkpoint
        return (f"{folder} not found, nor its run folder {folder.parent}: pass checkpoints/RUN_NAME of a run, a "
                "checkpoint-N inside it, or a Hub id")
    newer = checkpoints_by_step(folder.parent)
    held = f"; {folder.parent.name} holds {', '.join(p.name for p in newer[-3:])}" if newer else ""
    return (f"{folder} no longer exists (a running training's SAVE_TOTAL_LIMIT removes old checkpoints{held}): "
            "evaluate the run folder or a newer checkpoint")


def tokenizer_source(ref: ModelRef) -> str:
    """The model's own tokenizer: its folder, else (a Trainer checkpoint saved without one) the run folder's."""
    if ref.folder is not None and not (ref.folder / "tokenizer.json").is_file():
        parent = ref.folder.parent
        if (parent / "tokenizer.json").is_file():
            return str(parent)
    return ref.source


def _cannot_load(ref: ModelRef, exc: Exception) -> UserError:
    if ref.folder is not None and not ref.folder.is_dir():  # removed since it was resolved: never a Hub id
        return UserError(_gone(ref.folder))
    first = str(exc).splitlines()[0] if str(exc) else ""
    return UserError(f"cannot load model {ref.spec!r} ({type(exc).__name__}: {first}); Hub ids need network access "
                     "or a cached copy")


def check_loadable(ref: ModelRef) -> None:
    """Reads the model's config (cheap), so that a model that cannot be loaded is one line before any work starts."""
    from transformers import AutoConfig

    try:
        AutoConfig.from_pretrained(ref.source)
    except Exception as exc:  # reported against the user's value with the library's reason
        raise _cannot_load(ref, exc) from None


def load_model(ref: ModelRef, device: str | None = None, compute: bool = True) -> tuple[Any, Any, str]:
    """(model in eval mode, tokenizer, device): bf16 on a CUDA GPU that has it, fp32 elsewhere; on a CPU, for
    `compute`, with the compute threads of runtime.compute_threads, said in a line."""
    import torch
    from transformers import AutoModelForCausalLM

    from sparknet.common.runtime import hide_library_progress_bars, use_compute_threads
    from sparknet.tokenizer import load_tokenizer

    hide_library_progress_bars()
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    threads = use_compute_threads("cpu" if device == "cpu" and compute else "accelerator")
    if threads:
        logging.getLogger("sparknet.eval").info("%s on %s, %s", ref.spec, device, threads)
    dtype = torch.bfloat16 if device.startswith("cuda") and torch.cuda.is_bf16_supported() else torch.float32
    try:
        model = AutoModelForCausalLM.from_pretrained(ref.source, dtype=dtype)
    except Exception as exc:  # reported against the user's value with the library's reason
        raise _cannot_load(ref, exc) from None
    tokenizer = load_tokenizer(tokenizer_source(ref))
    return model.to(device).eval(), tokenizer, device

