"""A Hub-ready model folder from a run: weights (safetensors), config, generation config, tokenizer, and a README.md
model card built from training_metadata.json and whatever eval/<RUN_NAME>/ holds; optionally pushed to the Hub.

The card's YAML header is what the Hub indexes (license, datasets, language, library_name, pipeline_tag, and a
model-index when benchmark results exist), so it is built with huggingface_hub's own ModelCardData.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sparknet.common.errors import UserError
from sparknet.config.kinds import LOCAL_KINDS
from sparknet.config.mix import printable
from sparknet.data.spec import PIECE_BLOCKS
from sparknet.eval.models import ModelRef, load_model, resolve_model
from sparknet.eval.reports import eval_dir, markdown_table
from sparknet.model.presets import set_for_use

UNSET_LICENSE = "other"  # the card's license while LICENSE is not set: the Hub's id for "not one of the listed"
CARD_IMAGE = "loss.png"  # the loss curve, copied beside the card when scripts/plot_runs.py has drawn it
BENCHMARKS = "benchmarks.json"  # {"results": {task: the fullest scores}, "settings": ...}: eval_benchmarks.py


def export_model(spec: str, output_dir: Path, *, license: str = "", language: list[str] | None = None,
                 eval_root: str = "eval", overwrite: bool = False, repo_id: str = "", unfinished: bool = False) -> Path:
    """Writes the folder and returns the card's path. `spec`: checkpoints/RUN_NAME or a checkpoint-N inside it;
    `repo_id`: the Hub repository the card's usage example loads (default: the folder, by its path, with a
    commented line for the Hub); `license`: a Hub license id ("": not set, the card says `other` and a warning
    asks for it: a model's licence follows its training data's, which the exporter knows, not SparkNet); `language`:
    the card's languages (None: none stated, as SparkNet does not know its sources' languages). The folder is
    written beside OUTPUT_DIR and put in place by renames, so an interrupted export leaves the old one whole; one
    export into a folder at a time (a second at once is refused in one line: both would build in one hidden folder).
    """
    from sparknet.common.locks import exclusive
    from sparknet.config.checks import check_values

    check_values({"LICENSE": license})  # the script's rule, for callers without the script
    ref = resolve_model(spec)
    if ref.folder is None:
        raise UserError(f"{spec}: export takes a run folder (checkpoints/RUN_NAME), not a Hub id")
    with exclusive(output_dir, "an export"), _nothing_half_written(output_dir):
        return _export(ref, output_dir, license=license, language=language, eval_root=eval_root, overwrite=overwrite,
                       repo_id=repo_id, unfinished=unfinished)


@contextmanager
def _nothing_half_written(output_dir: Path) -> Iterator[None]:
    """An export that fails (a write fault: `ulimit -f`, a full disk) or is stopped leaves no half-built folder
    beside OUTPUT_DIR; the old export, replaced only by renames once the new one is whole, stays as it was."""
    try:
        yield
    except BaseException:
        # (stopped between replace_folder's two renames, the new folder is whole and the only one left to put in
        # place: kept)
        if output_dir.exists() or not output_dir.with_name(f".{output_dir.name}.replaced").exists():
            shutil.rmtree(output_dir.with_name(f".{output_dir.name}.building"), ignore_errors=True)
        raise


def _export(ref: ModelRef, output_dir: Path, *, license: str, language: list[str] | None, eval_root: str,
            overwrite: bool, repo_id: str, unfinished: bool) -> Path:
    """`export_model`'s work, under its lock."""
    from sparknet.common.runtime import follow_umask, replace_folder, writes_to
    from sparknet.common.write_faults import writing
    from sparknet.eval.results import check_benchmarks, check_perplexities
    from sparknet.run_files import RUN_CONFIG, read_metadata
    from sparknet.tokenizer import save as save_tokenizer

    spec = ref.spec
    if output_dir.exists() and any(output_dir.iterdir()) and not overwrite:
        raise UserError(f"{output_dir} is not empty: choose another OUTPUT_DIR or pass --overwrite true")
    metadata = read_metadata(ref.folder) or {}  # a checkpoint-N reads its run's; {} for a model trained elsewhere
    if not metadata and (ref.folder / RUN_CONFIG).is_file() and not unfinished:
        raise UserError(f"{spec} has no training_metadata.json: its training did not finish (stopped while it wrote "
                        "the final model?). Run the same training command again, which completes it, or pass "
                        "--unfinished true to export the folder as it is")
    model, tokenizer, _ = load_model(ref, device="cpu", compute=False)  # weights moved, nothing computed
    # as the trainer's final save sets them, whatever the folder: a checkpoint-N holds the Trainer's (no KV cache)
    set_for_use(model, tokenizer)
    results = eval_dir(ref.name, eval_root)
    perplexities, benchmarks = _read_json(results / "perplexity.json"), _read_json(results / BENCHMARKS)
    check_perplexities(results / "perplexity.json", perplexities)
    check_benchmarks(results / BENCHMARKS, benchmarks)
    writes_to(output_dir.parent)
    building = output_dir.with_name(f".{output_dir.name}.building")
    shutil.rmtree(building, ignore_errors=True)
    building.mkdir(parents=True)
    with writing(building / "model.safetensors"):  # safetensors names no path in its errors
        model.save_pretrained(building)  # safetensors, config.json, generation_config.json
    follow_umask(building)  # safetensors writes 0600
    save_tokenizer(tokenizer, building)
    image = results / "plots" / CARD_IMAGE
    if image.is_file():
        shutil.copy(image, building / CARD_IMAGE)
    if not license:
        import logging

        logging.getLogger("sparknet.export").warning(
            "LICENSE is not set: the card says `license: %s`. A model's licence follows its training data's: set it "
            "with --license (a Hub license id, e.g. apache-2.0, mit, cc-by-sa-4.0, gpl-3.0)", UNSET_LICENSE)
    card = model_card(ref, model, metadata, perplexities, benchmarks, has_image=image.is_file(),
                      license=license, language=language or None, repo_id=repo_id,
                      local_path=usage_path(output_dir))
    (building / "README.md").write_text(card, encoding="utf-8")
    replace_folder(building, output_dir)
    return output_dir / "README.md"


def usage_path(output_dir: Path) -> tuple[str, str]:
    """The card's local path to the folder and where it holds from: relative to the project root when the folder is
    inside it (the scripts' paths are; the user is there right after the export), else the folder's name. Written
    with "./", which the Hub never takes for a repository id: a missing folder fails at once, not after asking the
    Hub."""
    from sparknet.common.runtime import PROJECT_ROOT

    try:
        return f"./{output_dir.resolve().relative_to(PROJECT_ROOT)}", "run from the project root it was exported in"
    except ValueError:
        return f"./{output_dir.name}", "run from the folder that holds it"


def card_path(value: Any) -> str:
    """A path as a card shows it: never an absolute path of this machine (the card is published). Inside the
    project: relative to its root; elsewhere: the file or folder's name. Relative paths and Hub ids unchanged."""
    from sparknet.common.runtime import PROJECT_ROOT

    text = str(value)
    path = Path(text).expanduser()
    if not path.is_absolute():
        return text
    for candidate in (path, path.resolve()):
        try:
            return str(candidate.relative_to(PROJECT_ROOT))
        except ValueError:
            continue
    return path.name


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise UserError(f"{path} is not valid JSON ({exc.msg}): rerun the script that wrote it") from None


def card_data(name: str, metadata: dict[str, Any], benchmarks: dict[str, Any], *, license: str,
              language: list[str] | None) -> Any:
    """The YAML header. Hub datasets of the mix are listed (local files have no Hub id); benchmark results become
    a model-index; `language` only as the exporter states it (None or []: no `language` key): a run knows its
    sources, not their languages, and a mix with code or another language is no `en` model."""
    from huggingface_hub import EvalResult, ModelCardData

    from sparknet.harness import METRICS

    mix = metadata.get("config", {}).get("mix", [])
    datasets = sorted({entry["name"] for entry in mix if entry.get("name") is not None
                       and entry["name"] not in LOCAL_KINDS})
    # the fullest result of each task (`results`, sparknet.eval.results); its scores only, not its item count
    eval_results = [EvalResult(task_type="text-generation", dataset_type=task, dataset_name=task, metric_type=metric,
                               metric_value=float(metrics[metric]))
                    for task, metrics in benchmarks.get("results", {}).items() for metric in METRICS
                    if isinstance(metrics.get(metric), (int, float))]
    return ModelCardData(license=license or UNSET_LICENSE, language=language or None, library_name="transformers",
                         pipeline_tag="text-generation", datasets=datasets or None, tags=["sparknet", "causal-lm"],
                         model_name=name.replace("/", "-"), eval_results=eval_results or None,
                         base_model=base_model_name(metadata))


def base_model_name(metadata: dict[str, Any]) -> str | None:
    """The YAML's `base_model`, which the Hub reads as a repository id: the Hub model the run started from (INIT_FROM),
    None for a local base (named in the card's text instead, `base_model_text`) and for a model trained from
    scratch. A base is a Hub model when its record has a Hub commit (a Hub id, or a Hub cache snapshot) or no
    weights hash (a Hub id whose commit was not known)."""
    base = metadata.get("base_model")
    if not isinstance(base, dict) or not base.get("name"):
        return None
    return base["name"] if base.get("commit") is not None or base.get("sha256") is None else None


def base_model_text(metadata: dict[str, Any]) -> str:
    """How the model came to be, for the card's first sentence: from scratch, or trained further from a Hub model (at
    its commit) or from a local model (its run's name, checkpoint step and weights' sha256, which identify it where
    its name does not)."""
    base = metadata.get("base_model")
    if not isinstance(base, dict) or not base.get("name"):
        return "trained from scratch"
    if base_model_name(metadata) is not None:
        commit = f" at commit `{base['commit']}`" if base.get("commit") else ""
        return f"trained further from the Hub model `{base['name']}`{commit}"
    step = f", step {base['step']}" if base.get("step") is not None else ""
    return (f"trained further from a local model (run `{printable(base['name'])}`{step}; weights sha256 "
            f"`{base.get('sha256')}`, not on the Hub)")


def model_card(ref: ModelRef, model: Any, metadata: dict[str, Any], perplexity: dict[str, Any],
               benchmarks: dict[str, Any], *, has_image: bool, license: str, language: list[str] | None,
               repo_id: str, local_path: tuple[str, str]) -> str:
    """README.md: YAML header, then what the model is, how it was trained, how well it does, how to use it.
    `ref`: the model exported (its name; a run's checkpoint-N, whose weights are that step's, not those the run's
    metadata ends with); `repo_id`: the Hub repository ("": not pushed); `local_path`: the folder's path and where it
    holds from; `language`: the languages the exporter states (None: the header names none)."""
    from sparknet.run_files import checkpoint_step, run_of

    name = ref.name
    checkpoint = checkpoint_step(ref.folder) if ref.folder is not None and run_of(ref.folder) != ref.folder else None
    data = card_data(name, metadata, benchmarks, license=license, language=language)
    config = model.config
    parameters = sum(p.numel() for p in model.parameters())
    settings, metrics = metadata.get("settings", {}), metadata.get("metrics", {})
    origin = base_model_text(metadata)
    body = [f"# {name.replace('/', '-')}", "",
            f"A {parameters / 1e6:.1f}M-parameter {config.model_type} causal language model {origin} with "
            "SparkNet (the Hugging Face Trainer, `transformers`).", "", "## Model", "",
            markdown_table(["", ""], [["architecture", type(model).__name__],
                                      ["parameters", parameters],
                                      ["layers", getattr(config, "n_layer", getattr(config, "num_hidden_layers", "?"))],
                                      ["width", getattr(config, "n_embd", getattr(config, "hidden_size", "?"))],
                                      ["heads", getattr(config, "n_head", getattr(config, "num_attention_heads", "?"))],
                                      ["context", getattr(config, "n_positions",
                                                          getattr(config, "max_position_embeddings", "?"))],
                                      ["vocabulary", config.vocab_size],
                                      ["preset", metadata.get("model", {}).get("name") or "-"]]),
            "## Tokenizer", "",
            f"Byte-level BPE, vocabulary {config.vocab_size}, `<|endoftext|>` as bos/eos/pad "
            f"(trained: `{card_path(metadata.get('tokenizer', {}).get('path', '-'))}`). {_end_of_text_text(metadata)}",
            ""]
    body += _training_section(metadata, settings, metrics, checkpoint)
    body += _results_section(perplexity, benchmarks, has_image)
    body += _usage_section(repo_id, local_path)
    if not license:
        body += ["## License", "", "Not stated by the exporter (`license: other`): the licence of the training data "
                 "applies.", ""]
    body += ["## Limitations", "",
             "A small model trained on a small token budget: it produces fluent-looking but often wrong or "
             "meaningless text, has no instruction tuning or safety training, and reflects the biases of its "
             "training data. For research and education, not for decisions or facts.", ""]
    return f"---\n{data.to_yaml()}\n---\n\n" + "\n".join(body)


def _end_of_text_text(metadata: dict[str, Any]) -> str:
    """How `<|endoftext|>` was and is encoded (sparknet.tokenizer's rule): training's literal as text, the user's
    `tokenizer.eos_token` as the eos id."""
    trained = ("In training, a literal `<|endoftext|>` inside a document was text, encoded as its characters; only the "
               "end of text SparkNet appended after each document was the eos id. ") if metadata else ""
    return (f"{trained}This tokenizer encodes `tokenizer.eos_token` in your text as the eos id, as GPT-2's does: "
            "`tokenizer(text + tokenizer.eos_token)` ends with the end of text (load it with "
            "`split_special_tokens=True` to encode a literal as text instead).")


def _usage_section(repo_id: str, local_path: tuple[str, str]) -> list[str]:
    """The usage example: one `model_path` line runs, the other is commented; each says which it is. Pushed, the
    Hub repository runs; else the folder (a placeholder repository for after a push)."""
    path, where = local_path
    folder = f'model_path = "{path}"  # this folder, {where}'
    if repo_id:
        lines = [f'model_path = "{repo_id}"  # the Hub repository', f"# {folder}"]
    else:
        placeholder = f"your-name/{Path(path).name}"
        lines = [folder, f'# model_path = "{placeholder}"  # the Hub repository, once pushed '
                         f"(scripts/export_model.py --push_to_hub {placeholder})"]
    return ["## How to use", "", "```python", "from transformers import AutoModelForCausalLM, AutoTokenizer, pipeline",
            "", *lines, "tokenizer = AutoTokenizer.from_pretrained(model_path)",
            "model = AutoModelForCausalLM.from_pretrained(model_path)",
            'inputs = tokenizer("The history of", return_tensors="pt")',
            "print(tokenizer.decode(model.generate(**inputs, max_new_tokens=40, do_sample=True)[0]))", "",
            'generator = pipeline("text-generation", model=model_path)',
            'print(generator("def fibonacci(n):", max_new_tokens=40)[0]["generated_text"])', "```", ""]


def _training_section(metadata: dict[str, Any], settings: dict[str, Any], metrics: dict[str, Any],
                      checkpoint: int | None) -> list[str]:
    """What the model was trained on and how, which weights these are, and the run's final metrics (`checkpoint`:
    the step of the checkpoint-N exported, None for the run's final model)."""
    if not metadata:
        return ["## Training", "", "No training_metadata.json was found for this model.", ""]
    out = ["## Training data", ""] + _sources_table(metadata) + _data_text(metadata)
    out += [f"Mix config: `{card_path(metadata.get('config', {}).get('path', '-'))}` (not shipped with the model; "
            "the sources above are what it named).", ""]
    out += _phases_table(metadata)
    out += ["## Training", "", markdown_table(["setting", "value"], _settings_rows(metadata, settings))]
    out += _weights_text(metadata, checkpoint)
    final_keys = ("eval_loss", "eval_perplexity", "eval_bits_per_byte", "train_loss", "tokens_per_second_mean")
    final = [[key, str(round(metrics[key], 4))] for key in final_keys if metrics.get(key) is not None]
    if final:
        out += [f"Final metrics. The eval figures are {validation_text(metadata)}. train_loss is the mean training "
                "loss of the last logging window, tokens_per_second_mean the training's throughput:", "",
                markdown_table(["metric", "value"], final)]
    per_source = metrics.get("eval_per_source") or {}
    if per_source:
        from sparknet.model.metrics import perplexity

        rows = [[label, figures.get("tokens", "-"), figures["loss"], perplexity(figures["loss"]),
                 figures.get("bits_per_byte", "-")] for label, figures in per_source.items()]
        out += ["Final eval loss per source, over the tokens of each source that the validation blocks predict (every "
                "token of a block but its first, `<|endoftext|>` included):", "",
                markdown_table(["source", "predicted tokens", "loss", "perplexity", "bits/byte"], rows)]
    return out


def _data_text(metadata: dict[str, Any]) -> list[str]:
    """How the data reached training: streamed (its shuffle buffer and window, its processes, its own validation
    hold-out) or from a packed dataset (whose validation split the final metrics are on)."""
    stream = metadata.get("stream")
    if isinstance(stream, dict):
        if "shuffle_buffer" in stream:
            buffer, window = stream["shuffle_buffer"], stream.get("shuffle_window") or 0
            order = (f"each source's documents shuffled in a buffer of {buffer:,} documents" if buffer else
                     "each source read in its own order (no shuffle buffer)")
            order += (f", the training blocks handed out in a seeded order within windows of at most {window:,} "
                      "blocks per process"
                      if window else ", the training blocks in the stream's order (no shuffle window)")
        else:  # metadata written before the stream recorded them
            order = "its shuffle buffer and window are not recorded in this run's metadata"
        world = metadata.get("world_size") or 1
        processes = stream.get("training", {}).get("processes")
        if world <= 1:
            spread = ""
        elif processes == world:
            spread = (f" It ran on {world} processes, each reading its own documents of each source: the table counts "
                      "all of them.")
        else:  # rank 0's figures alone, as the metadata recorded them before they were summed
            seen = metadata.get("tokens_seen")
            spread = (f" It ran on {world} processes, each reading its own documents of each source; the table's "
                      "tokens and documents are process 0's stream alone (this run's metadata was written before "
                      "they were summed over processes)" + (f": the run trained on {seen:,} tokens in all." if
                                                            isinstance(seen, int) else "."))
        return [f"Streamed: the sources were read, encoded and mixed while the model trained "
                f"(scripts/train_sparknet.py), not read from a packed dataset; {order}.{spread} Its validation "
                "blocks are its own hold-out, not a dataset's split: the first tokens of the mix, taken from the "
                "start of each source before training; training read on after them, took the rest of each document "
                "they cut, and dropped any verbatim repeat of one of their documents.", ""]
    dataset = metadata.get("dataset")
    if isinstance(dataset, dict) and dataset.get("path"):
        return [f"From the packed dataset `{printable(card_path(dataset['path']))}` (scripts/build_dataset_v5.py): "
                "the blocks of its train split; its validation split, which the build held out from the start of "
                "the mix, is what the final metrics are on.", ""]
    return []


def validation_text(metadata: dict[str, Any]) -> str:
    """Which validation blocks the run's final eval is on ("on ..."), and their size: blocks, tokens and documents
    (the stream's own hold-out, or the packed dataset's validation split), and the tokens the eval loss averages."""
    stream, dataset = metadata.get("stream"), metadata.get("dataset")
    if isinstance(stream, dict) and isinstance(stream.get("validation"), dict):
        split, sources = "the run's own validation hold-out", stream["validation"].get("sources") or {}
        blocks, tokens = stream["validation"].get("blocks"), stream["validation"].get("tokens")
    elif isinstance(dataset, dict) and (dataset.get("realised_mixture") or {}).get("val"):
        split, sources = "the dataset's validation split", dataset["realised_mixture"]["val"]
        tokens = sum(int(source.get("tokens", 0)) for source in sources.values())
        block_size = (dataset.get("inputs") or {}).get("block_size")
        blocks = tokens // block_size if isinstance(block_size, int) and block_size > 0 else None
    else:
        return "on the run's validation blocks (their size is not recorded)"
    size = []
    if isinstance(blocks, int):
        size.append(f"{blocks:,} blocks")
    if isinstance(tokens, int):
        size.append(f"{tokens:,} tokens")
    documents = [source.get("documents") for source in sources.values()]
    if documents and all(isinstance(count, int) for count in documents):
        cut = sum(int(source.get("documents_cut") or 0) for source in sources.values())
        size.append(f"from {sum(documents):,} documents" + (
            f" ({cut:,} of them only their start, cut at their source's cap; training took the rest of those)"
            if cut else ""))
    # the eval loss is the mean over the tokens the blocks predict: all but each block's first
    predicted = (f". The eval loss averages the {tokens - blocks:,} tokens they predict (all but each block's first)"
                 if isinstance(blocks, int) and isinstance(tokens, int) else "")
    return f"on {split}" + (f": {', '.join(size)}{predicted}" if size else "")


def _weights_text(metadata: dict[str, Any], checkpoint: int | None) -> list[str]:
    """Which weights the folder holds, from the metadata: the run ends with the checkpoint of the lowest eval loss
    (the Trainer's load_best_model_at_end, sparknet.train.hf_trainer.training_arguments), which may or may not be
    the last step's; a checkpoint-N exported is that checkpoint, whatever the run ended with."""
    from sparknet.run_files import checkpoint_step

    metrics, steps = metadata.get("metrics", {}), metadata.get("steps")
    of_steps = f" of {steps:,}" if isinstance(steps, int) else ""
    best = metrics.get("best_checkpoint")
    best_step = checkpoint_step(Path(best)) if isinstance(best, str) else None
    if checkpoint is not None:
        final = (f"checkpoint-{best_step}, the lowest eval loss" if best_step is not None else "the last step's")
        return [f"Weights: the run's checkpoint-{checkpoint} (step {checkpoint:,}{of_steps}), exported as it is, not "
                f"the model the run ended with ({final}): the final metrics below are that model's, not these "
                "weights'.", ""]
    if best_step is not None:
        last = ("the last step's, which had the lowest eval loss of the checkpoints evaluated"
                if best_step == steps else "not the last step's: the checkpoint with the lowest eval loss")
        return [f"Weights: checkpoint-{best_step} (step {best_step:,}{of_steps}), {last} (the run ends with its best "
                "checkpoint by eval loss: load_best_model_at_end).", ""]
    if "best_checkpoint" in metrics and isinstance(steps, int):  # recorded, and none: no best to go back to
        return [f"Weights: the last step's (step {steps:,}): no checkpoint was recorded as the best.", ""]
    return []


def _sources_table(metadata: dict[str, Any]) -> list[str]:
    """Each source of the mix: its kind, its files or Hub id (subset, split, revision and the commit read), the column
    its documents were read from, and what training took of it (the realised share against the requested one)."""
    mix = metadata.get("dataset", {}).get("realised_mixture", {}).get("train", {})
    streamed = metadata.get("stream", {}).get("training", {})
    if not mix and streamed.get("shares"):  # the streaming trainer's realised mix, per figure
        mix = {label: {"tokens": streamed.get("tokens", {}).get(label, 0),
                       "documents": streamed.get("documents", {}).get(label, 0), "share": share,
                       "requested_share": streamed.get("requested_shares", {}).get(label, 0),
                       "validation_repeats_removed": streamed.get("validation_repeats_removed", {}).get(label, 0)}
               for label, share in streamed["shares"].items()}
    entries = {entry.get("label"): entry for entry in metadata.get("config", {}).get("mix", [])}
    columns, revisions = metadata.get("text_columns") or {}, metadata.get("source_revisions") or {}
    rows = []
    for label in mix or entries:
        entry, info = entries.get(label, {}), mix.get(label, {})
        kind, where = _source_place(entry, revisions.get(label) or {})
        column = columns.get(label) or entry.get("text_field")
        rows.append([label, kind, where, f"`{printable(column)}`" if column else "-", info.get("tokens", "-"),
                     info.get("documents", "-"), f"{info['share']:.2%}" if "share" in info else "-",
                     f"{info['requested_share']:.2%}" if "requested_share" in info else "-",
                     info.get("validation_repeats_removed", "-")])
    if not rows:
        return []
    return [markdown_table(["source", "kind", "files or Hub id", "column read", "tokens", "documents", "share",
                            "requested", "validation repeats removed"], rows),
            "Documents that repeat a validation document verbatim are removed from training (counted above); "
            f"a document longer than {PIECE_BLOCKS} blocks is mixed in pieces, each counted as a document.", ""]


def _source_place(entry: dict[str, Any], revision: dict[str, Any]) -> tuple[str, str]:
    """A mix entry's kind and where its documents come from, as the card shows them: a local kind's files (paths
    as `card_path` shows them: no path of this machine), or a Hub dataset's id with its subset, split and the
    revision and commit it was read at."""
    name = str(entry.get("name", "-"))
    if name in LOCAL_KINDS:
        files = entry.get("data_files")
        groups = files.items() if isinstance(files, dict) else [(None, files)]
        shown = []
        for split, group in groups:
            paths = [group] if isinstance(group, str) else list(group or [])
            listed = ", ".join(f"`{printable(card_path(path))}`" for path in paths[:5])
            listed += f" and {len(paths) - 5} more" if len(paths) > 5 else ""
            shown.append(f"{split}: {listed}" if split else listed)
        return f"local {LOCAL_KINDS[name].files}", "; ".join(shown) or "-"
    where = f"`{printable(card_path(name))}`"
    where += f", subset `{entry['subset']}`" if entry.get("subset") else ""
    where += f", split `{entry.get('split', 'train')}`"
    if revision.get("commit"):
        pinned = f"revision `{entry['revision']}`, " if entry.get("revision") else ""
        where += f", {pinned}commit `{revision['commit']}`"
    elif entry.get("revision"):
        where += f", revision `{entry['revision']}`"
    else:
        where += ", default branch (commit not recorded)"
    return "Hub dataset", where


def _phases_table(metadata: dict[str, Any]) -> list[str]:
    """A run in phases: each phase's share of the training tokens, its optimizer steps and its mix."""
    asked = metadata.get("config", {}).get("phases") or []
    ran = {phase.get("name"): phase for phase in metadata.get("phases") or []}
    if len(asked) < 2:
        return []
    rows = []
    for phase in asked:
        steps = ran.get(phase.get("name"), {}).get("steps")
        mix = ", ".join(f"{printable(label)} {prob:.0%}" for label, prob in (phase.get("probs") or {}).items())
        rows.append([phase.get("name", "-"), f"{phase.get('share', 0):.0%}",
                     f"{steps[0]:,}-{steps[1]:,}" if steps else "-", mix])
    return ["Phases (each a mix over its share of the training tokens, in order):", "",
            markdown_table(["phase", "share of tokens", "steps", "mix"], rows)]


def _settings_rows(metadata: dict[str, Any], settings: dict[str, Any]) -> list[list[str]]:
    """The training settings the card lists: the optimizer's own (not another optimizer's), the LR schedule as the
    steps it took, and the two seeds, each named for what it seeds."""
    from sparknet.model.optimizers import OPTIMIZERS

    optimizer = OPTIMIZERS.get(str(settings.get("optimizer")))
    keys = ["target_tokens", "global_batch_size", "batch_size", "optimizer", "learning_rate",
            *(optimizer.settings if optimizer else ()), "weight_decay", "adam_betas", "max_grad_norm", "dropout"]
    # as written in the settings (0.002, not 0.0020): str() keeps the table from reformatting them
    rows = [[key, json.dumps(settings[key]) if isinstance(settings[key], list) else str(settings[key])]
            for key in keys if key in settings]
    schedule = lr_schedule_text(metadata, settings)
    if schedule:
        rows.append(["lr schedule", schedule])
    # the packed trainer draws its blocks in SEED's order; the stream hands them out in windows the data seed orders
    streamed = isinstance(metadata.get("stream"), dict)
    if "seed" in settings:
        seeds = "initialisation, dropout" if streamed else "initialisation, dropout, the order blocks are drawn in"
        rows.append([f"training seed (SEED: {seeds})", str(settings["seed"])])
    data_seed = data_seed_of(metadata)
    if data_seed is not None:
        seeds = ("each source's shuffle, the order of the blocks in each window, and the validation hold-out"
                 if streamed else "each source's shuffle and the validation hold-out")
        rows.append([f"data seed ({seeds})", str(data_seed)])
    rows += [["steps", metadata.get("steps", "-")], ["tokens seen", metadata.get("tokens_seen", "-")],
             ["world size", metadata.get("world_size", "-")], ["device", metadata.get("device", {}).get("name", "-")],
             ["wall time (s)", str(metadata.get("wall_seconds", "-"))]]
    return rows


def data_seed_of(metadata: dict[str, Any]) -> int | None:
    """The seed of the data: the packed build's SEED (its manifest's inputs), the stream's DATA_SEED, else the mix
    config's seed (their default)."""
    for value in (metadata.get("dataset", {}).get("inputs", {}) or {}).get("seed"), \
            metadata.get("stream", {}).get("data_seed"), metadata.get("config", {}).get("seed"):
        if isinstance(value, int):
            return value
    return None


def lr_schedule_text(metadata: dict[str, Any], settings: dict[str, Any]) -> str:
    """The LR schedule as the steps it took (sparknet.train.hf_trainer.lr_schedule): the warmup, then cosine to the
    floor, or (wsd) the peak held and a linear decay over the last DECAY_RATIO of the steps or the last phase."""
    from sparknet.train.hf_trainer import warmup_steps, wsd_decay_steps

    steps, schedule = metadata.get("steps"), settings.get("lr_schedule")
    if not isinstance(steps, int) or steps <= 0 or schedule not in ("cosine", "wsd"):
        return ""
    peak, floor = settings.get("learning_rate"), settings.get("min_lr_ratio", 0)
    warmup = warmup_steps(float(settings.get("warmup_ratio", 0)), steps)  # as the run took it
    start = f"linear warmup over steps 1-{warmup}, then " if warmup else ""
    if schedule == "cosine":
        return f"cosine: {start}a cosine decay from {peak} to {floor} x {peak} at step {steps:,}"
    phases = [phase["steps"][1] for phase in metadata.get("phases") or [] if phase.get("steps")]
    decay = wsd_decay_steps(steps, phases or None, float(settings.get("decay_ratio", 0.2)))
    last = " (the last phase)" if len(phases) > 1 else ""
    return (f"wsd: {start}{peak} held to step {steps - decay:,}, then a linear decay to {floor} x {peak} over steps "
            f"{steps - decay + 1:,}-{steps:,}{last}")


def _results_section(perplexity: dict[str, Any], benchmarks: dict[str, Any], has_image: bool) -> list[str]:
    """The loss curve, then each evaluation's fullest result (sparknet.eval.results) with what it was computed on:
    documents and tokens, items and shots."""
    from sparknet.eval.results import fullest_perplexities

    out = []
    if has_image:
        out += ["## Loss curve", "", f"![loss curve]({CARD_IMAGE})", ""]
    shown = fullest_perplexities(perplexity)
    if shown:
        rows = []
        for row in shown:
            data = card_path(row.get("data", "-")) + (f" ({row['split']})" if row.get("split") else "")
            # under each result, a row per mix source it was scored on (as eval_perplexity.py prints them)
            parts = [("", row), *((f" [{label}]", part) for label, part in row.get("sources", {}).items())]
            for label, figures in parts:
                rows.append([data + label, figures.get("documents", "-"), figures.get("tokens", "-"),
                             row.get("context", "-"), row.get("stride", "-"), figures.get("nll", "-"),
                             figures.get("perplexity", "-"), figures.get("bits_per_byte", "-")])
        out += ["## Evaluation", "", "Sliding-window perplexity (scripts/eval_perplexity.py), the fullest evaluation "
                "on each data source, and per source of the mix where the data records them; tokens scored: the "
                "documents' tokens, each predicted from those before it in its document:", "",
                markdown_table(["data", "documents", "tokens scored", "context", "stride", "nll", "perplexity",
                                "bits/byte"], rows)]
    if benchmarks.get("results"):
        rows = [[task, metrics.get("items", "-"), metrics.get("shots", "-"),
                 *(metrics.get(k, "-") for k in ("acc", "acc_stderr", "acc_norm", "acc_norm_stderr"))]
                for task, metrics in benchmarks["results"].items()]
        out += ["## Benchmarks", "", "lm-eval-harness (scripts/eval_benchmarks.py), the fullest run of each task:", "",
                markdown_table(["task", "items", "shots", "acc", "± stderr", "acc_norm", "± stderr"], rows)]
    return out


def push_to_hub(folder: Path, repo: str, private: bool = False) -> str:
    """Uploads the folder to the Hub model repository `repo` (created if needed). The token comes from HF_TOKEN or
    the saved login (`hf auth login`); it is never printed. Returns the repository URL."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError, OfflineModeIsEnabled

    api = HfApi()
    try:
        url = api.create_repo(repo, repo_type="model", private=private, exist_ok=True)
        api.upload_folder(repo_id=repo, folder_path=str(folder), repo_type="model",
                          commit_message="Upload SparkNet model")
    except OfflineModeIsEnabled:
        raise UserError(f"cannot push to {repo}: offline mode is on (HF_HUB_OFFLINE=1); the folder {folder} is "
                        "ready, push it later with --push_to_hub from a machine with network access") from None
    except HfHubHTTPError as exc:
        status = getattr(exc.response, "status_code", None)
        hint = ": log in with `hf auth login` or set HF_TOKEN" if status in (401, 403) else ""
        raise UserError(f"cannot push to {repo} (HTTP {status}){hint}") from None
    except OSError as exc:  # no network at all (DNS, connection refused)
        raise UserError(f"cannot push to {repo}: {type(exc).__name__}: the Hub is unreachable") from None
    return str(url)
