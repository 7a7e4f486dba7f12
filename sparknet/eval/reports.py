"""Where evaluation results go: eval/<name>/ (JSON the export reads back, markdown a user can paste) and tables."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sparknet.common.outputs import Output
from sparknet.common.runtime import project_path, read_json_object, write_json_atomic
from sparknet.config.mix import printable


def eval_dir(name: str, root: str = "eval") -> Path:
    """eval/<name>/ for one model (RUN_NAME, RUN_NAME/checkpoint-N, or a Hub id with "/" as "__"): always a folder
    inside `root` (EVAL_DIR), never `root` itself or a folder beside it."""
    if name.startswith("/") or any(part in ("", ".", "..") for part in name.split("/")):
        from sparknet.common.errors import UserError

        raise UserError(f"the results of model {name!r} would not be inside EVAL_DIR={root}: name the model by its "
                        "folder (checkpoints/RUN_NAME or a checkpoint-N inside it) or its Hub id")
    return project_path(root) / name


def eval_outputs(names: list[str], root: str, subfolder: str = "", names_from: str = "MODELS") -> list[Output]:
    """The folders an evaluation of the models `names` (from the constant `names_from`) writes: each model's, and
    the comparison's when there are several (`subfolder` inside each), to check before any work
    (sparknet.common.outputs)."""
    folders = [*names, comparison_name(names)] if len(names) > 1 else names
    return [Output("EVAL_DIR", eval_dir(name, root) / subfolder, name_constant=names_from) for name in folders]


def comparison_name(names: list[str]) -> str:
    """The folder of a report over several models: their names joined (a checkpoint's "/" becomes "-")."""
    return "_vs_".join(n.replace("/", "-") for n in names)


def read_results(path: Path) -> dict[str, Any]:
    """The JSON object of results at `path` ({} when there is none yet); one line naming a damaged file."""
    if not path.is_file():
        return {}
    return read_json_object(path, "the results it held are lost; delete or move it away, and the evaluation writes "
                                  "it anew")


def check_results(paths: list[Path], check: Callable[[Path, dict[str, Any]], None]) -> None:
    """Reads every results file an evaluation will add to, before the evaluation runs: a damaged one, or one that
    `check` refuses (sparknet.eval.results: a file from before results were kept per setting), stops it at once,
    not after the work."""
    for path in paths:
        check(path, read_results(path))


def merge_json(path: Path, key: str, value: Any) -> dict[str, Any]:
    """Adds `value` under `key` to the JSON object at `path` (kept: results under other keys), written atomically;
    the key goes last, so the file's order is the order results were written in (sparknet.eval.results)."""
    def add(data: dict[str, Any]) -> None:
        data.pop(key, None)
        data[key] = value

    return update_json(path, add)


def update_json(path: Path, update: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    """Reads the JSON object at `path` ({} when there is none), lets `update` change it, and writes it atomically.
    Computed results are never dropped: should the file have been damaged since `check_results`, it is moved aside
    (`<name>.damaged`, with a warning) and a new one is written."""
    import logging

    from sparknet.common.errors import UserError
    from sparknet.common.locks import held

    path.parent.mkdir(parents=True, exist_ok=True)
    # one writer at a time: evaluations of one model may run at once (perplexity beside benchmarks, two datasets),
    # and each adds its results to the file; unlocked, the later write dropped the other's (a lost update). The
    # lock is held for a read and a write, so a second evaluation waits for it rather than being refused.
    with held(path.with_name(f".{path.name}.lock")):  # removed when done: no lock file stays beside the results
        try:
            data = read_results(path)
        except UserError as exc:
            aside = path.with_name(path.name + ".damaged")
            path.replace(aside)
            logging.getLogger("sparknet.eval").warning("%s; moved to %s, the new results are written to %s", exc,
                                                       aside, path)
            data = {}
        update(data)
        write_json_atomic(path, data)
    return data


@contextmanager
def results_kept(what: str, results: Any, table: str) -> Iterator[None]:
    """Writes results inside. A write that fails there (a folder made read-only, a file where a folder should be, a
    file size limit, a full disk) loses nothing computed: `table` (the results computed so far) is printed,
    `results` (the same, as JSON data) saved in the temporary folder, and the fault is one line naming the path,
    what its errno means and where the results went. The results files written before stay as they were (each is
    replaced whole, or not at all)."""
    try:
        yield
    except OSError as exc:
        import json
        import os
        import tempfile
        import time

        from sparknet.common.errors import UserError
        from sparknet.common.write_faults import fault_line

        print(table, flush=True)
        stamp = f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
        saved = Path(tempfile.gettempdir()) / f"sparknet-{what.replace(' ', '-')}-{stamp}.json"
        try:
            saved.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
            where = f"printed above and saved in {saved}"
        except OSError as again:
            saved.unlink(missing_ok=True)
            where = f"printed above (saving them in {saved.parent} failed too: {again.strerror})"
        line = fault_line(str(exc.filename or "the results"), exc.errno) if exc.errno else str(exc)
        raise UserError(f"{line}. The {what} computed are {where}; the results files written before are as they "
                        "were; then run the same command again") from None


def markdown_table(header: list[str], rows: list[list[Any]]) -> str:
    """A GitHub markdown table; floats to 4 decimals, ints with thousands separators; a cell's `|` escaped, and any
    character that ends a line (a file name with a newline would end its row) written as its escape."""
    def cell(value: Any) -> str:
        if isinstance(value, float):
            return f"{value:.4f}"
        if isinstance(value, int) and not isinstance(value, bool):
            return f"{value:,}"
        text = str(value)
        if len(text.splitlines()) > 1 or text.endswith(("\n", "\r")):  # \n, \r, \x0b, \x1c, \u2028, ...
            text = "".join(printable(c) if len(f"a{c}b".splitlines()) > 1 else c for c in text)
        return text.replace("|", "\\|")

    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def console_table(header: list[str], rows: list[list[Any]]) -> str:
    """The same table aligned for a terminal: text columns left-aligned, number columns (and their headers)
    right-aligned."""
    def numeric(value: Any) -> bool:
        return isinstance(value, (int, float)) and not isinstance(value, bool)

    cells = [[f"{v:.4f}" if isinstance(v, float) else f"{v:,}" if numeric(v) else str(v) for v in row] for row in rows]
    right = [bool(rows) and all(numeric(row[i]) for row in rows) for i in range(len(header))]
    widths = [max(len(h), *(len(r[i]) for r in cells)) for i, h in enumerate(header)]

    def line(values: list[str]) -> str:
        aligned = (v.rjust(w) if r else v.ljust(w) for v, w, r in zip(values, widths, right, strict=True))
        return "  ".join(aligned).rstrip()

    return "\n".join([line(header), *(line(row) for row in cells)])
