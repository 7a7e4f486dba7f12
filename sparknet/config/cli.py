"""The scripts' convention: a block of UPPER_CASE constants on top is the configuration, and every constant can be
overridden from the command line as `--name value` or `--name=value`.

Written by hand rather than with argparse because the flags are derived from a script's globals and their trailing
`# comments` (the one-line help), the value types from the defaults, and the errors must suggest the nearest flag.

Paths: a path typed on the command line means what it means to every shell tool, the current folder; a default
written in a script stays relative to the repository root (`runtime.project_path`), so scripts behave the same from
any folder. The rule: a flag value for a path constant (`CONFIG`, or a name ending in `_DIR`, `_FILE` or `_PATH`)
that is a relative path is made absolute against the current folder, and then, when it lies inside the repository,
written relative to the repository like the defaults (so the same folder is the same value whichever way it was
typed). Constants that may also name a Hub repository (`TOKENIZER_DIR`, `MODEL`, `MODELS`, `DATA`, `SUITE_DATA`) are
made absolute only when that path (or glob) exists in the current folder, so `gpt2` still means the Hub id; `DATA`
may be a comma-separated list, resolved item by item.
"""

from __future__ import annotations

import ast
import difflib
import glob
import io
import json
import math
import os
import signal
import sys
import tokenize
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sparknet.common.errors import UsageError, UserError

_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off"}


def constant_names(namespace: dict[str, Any]) -> list[str]:
    """The script's configuration: its UPPER_CASE globals holding plain values, in definition order."""
    plain = (bool, int, float, str, list, tuple, dict, type(None))
    return [k for k, v in namespace.items() if k.isupper() and not k.startswith("_") and isinstance(v, plain)]


def describe_constants(source: str) -> dict[str, str]:
    """Maps each top-level constant to its one-line help: the comment on its line, else the comment just above."""
    comments: dict[int, str] = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            comments[tok.start[0]] = tok.string.lstrip("#").strip()
    lines = source.splitlines()
    help_: dict[str, str] = {}
    for node in ast.parse(source).body:
        targets = (
            node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        )
        for target in targets:
            if not isinstance(target, ast.Name):
                continue
            text = comments.get(node.end_lineno or node.lineno) or comments.get(node.lineno)
            above = node.lineno - 1
            if text is None and above >= 1 and lines[above - 1].lstrip().startswith("#"):
                text = comments.get(above)
            help_[target.id] = text or ""
    return help_


_PROTOTYPES = {"int": 0, "float": 0.0, "str": "", "bool": False}
_CONTAINERS = {"list": [], "dict": {}}  # `list[str] | None`: a list (of str), not a str


def annotated_types(source: str) -> dict[str, Any]:
    """For constants annotated like `TARGET_TOKENS: int | None = None`, a value of the annotated type (0, 0.0, "",
    False, [], {}) that flags are parsed against; None defaults without an annotation are parsed as JSON."""
    out: dict[str, Any] = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names = {n.id for n in ast.walk(node.annotation) if isinstance(n, ast.Name)}
            containers = names & set(_CONTAINERS)
            plain = names & set(_PROTOTYPES)
            if len(containers) == 1:
                out[node.target.id] = _CONTAINERS[containers.pop()]
            elif not containers and len(plain) == 1:
                out[node.target.id] = _PROTOTYPES[plain.pop()]
    return out


# Path constants whose value may instead be a Hub repository id: resolved against the current folder only when the
# path exists there.
_MAYBE_HUB_IDS = {"TOKENIZER_DIR", "MODEL", "MODELS", "DATA", "SUITE_DATA", "INIT_FROM"}


def is_path_constant(name: str) -> bool:
    """Whether a constant holds a path (or paths) that a command-line value resolves against the current folder."""
    return name == "CONFIG" or name in _MAYBE_HUB_IDS or name.endswith(("_DIR", "_FILE", "_PATH"))


def resolve_typed_path(name: str, value: Any, cwd: str | None = None) -> Any:
    """A path constant's command-line value made absolute against the current folder (see the module docstring);
    lists are resolved item by item; empty strings and other values are kept."""
    if isinstance(value, list):
        return [resolve_typed_path(name, v, cwd) for v in value]
    if not isinstance(value, str) or not value or not is_path_constant(name):
        return value
    if name in _MAYBE_HUB_IDS and "," in value:  # a comma-separated list of files
        return ",".join(resolve_typed_path(name, v.strip(), cwd) for v in value.split(",") if v.strip())
    path = Path(value).expanduser()
    if path.is_absolute():
        return str(path)
    full = Path(cwd or os.getcwd()) / path
    if name in _MAYBE_HUB_IDS and not full.exists() and not glob.glob(str(full)):
        return value  # a Hub id (or a path under the repository, as before)
    from sparknet.common.runtime import PROJECT_ROOT

    resolved = os.path.normpath(full)
    inside = os.path.relpath(resolved, PROJECT_ROOT)
    # Inside the repository it is written as the defaults are (relative to it, which project_path reads back to the
    # same place), so `--dataset_dir datasets/x` from the repository root equals the default `datasets/x` in run
    # identities and dataset inputs.
    return inside if not inside.startswith("..") else resolved


def parse_value(name: str, raw: str, default: Any) -> Any:
    """Parses `raw` to the type of `default`; raises UsageError naming the flag and the expected type."""
    flag = f"--{name.lower()}"

    def bad(expected: str) -> UsageError:
        return UsageError(f"{flag}: expected {expected}, got {raw!r}")

    if isinstance(default, bool):
        low = raw.strip().lower()
        if low in _TRUE:
            return True
        if low in _FALSE:
            return False
        raise bad("true/false (or 1/0)")
    if isinstance(default, int):
        text = raw.strip().replace("_", "")
        try:
            return int(text)
        except ValueError:
            pass
        try:
            as_float = float(text)  # accepts 1e9 for a token budget, but only when it is a whole number
        except ValueError:
            raise bad("an integer") from None
        if math.isfinite(as_float) and as_float.is_integer():
            return int(as_float)
        raise bad("an integer")
    if isinstance(default, float):
        try:
            return float(raw.strip().replace("_", ""))
        except ValueError:
            raise bad("a number") from None
    if isinstance(default, str):
        return raw
    if isinstance(default, (list, tuple, dict)):
        kind = "a JSON object" if isinstance(default, dict) else "a JSON list"
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            if isinstance(default, dict):
                raise bad(kind) from None
            value = [raw] if raw and not raw.lstrip().startswith("[") else None
            if value is None:
                raise bad(kind) from None
        if isinstance(default, dict) != isinstance(value, dict) or not isinstance(value, (list, dict)):
            raise bad(kind)
        if isinstance(default, tuple):
            if default and len(value) != len(default):
                raise bad(f"a JSON list of {len(default)} values")
            return tuple(value)
        return value
    # A None default means "derived at run time" (e.g. from the config): take JSON when it parses, else the text.
    if raw.strip().lower() in {"none", "null"}:
        return None
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        return raw


def _help_text(namespace: dict[str, Any], names: list[str], helps: dict[str, str]) -> str:
    script = Path(namespace.get("__file__", "script")).name
    doc = (namespace.get("__doc__") or "").strip()
    out = [f"usage: python {script} [--name value ...]", ""]
    if doc:
        out += [doc, ""]
    out.append("constants (edit them at the top of the script, or override them here):")
    from sparknet.config.checks import RULES  # the allowed words of a choice (OPTIMIZER's from its registry)

    width = max((len(n) for n in names), default=0) + 2
    for name in names:
        default = json.dumps(namespace[name]) if not isinstance(namespace[name], str) else repr(namespace[name])
        choices = f" (one of: {', '.join(RULES[name].choices)})" if name in RULES and RULES[name].choices else ""
        out.append(f"  --{name.lower():<{width}} {helps.get(name, '')}{choices} (default: {default})")
    return "\n".join(out)


def apply_overrides(namespace: dict[str, Any], argv: list[str] | None = None) -> dict[str, Any]:
    """Overrides a script's UPPER_CASE globals in place from `argv`; returns every constant's final value.

    Prints the help and exits 0 on --help; raises UsageError on an unknown flag or a badly typed value.
    """
    argv = sys.argv[1:] if argv is None else argv
    names = constant_names(namespace)
    by_flag = {n.lower(): n for n in names}
    source_file = namespace.get("__file__")
    source = Path(source_file).read_text() if source_file else ""
    helps = describe_constants(source) if source else {}
    types = annotated_types(source) if source else {}
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg in ("-h", "--help"):
            print(_help_text(namespace, names, helps))
            raise SystemExit(0)
        if not arg.startswith("--") or arg == "--":
            raise UsageError(
                f"unexpected argument {arg!r}: every setting is a flag, e.g. --{names[0].lower()} VALUE"
                if names
                else f"unexpected argument {arg!r}: this script takes no arguments"
            )
        key, has_value, raw = arg[2:].partition("=")
        key = key.replace("-", "_").lower()
        if key not in by_flag:
            near = difflib.get_close_matches(key, list(by_flag), n=1, cutoff=0.5)
            hint = f"; did you mean --{near[0]}?" if near else "; see --help for the list"
            raise UsageError(f"unknown flag --{key}{hint}")
        name = by_flag[key]
        if not has_value:
            following = argv[i + 1] if i + 1 < len(argv) else None
            if isinstance(namespace[name], bool) and (following is None or following.startswith("--")):
                raw = "true"  # a bare boolean flag switches it on
            elif following is None:
                raise UsageError(f"--{key}: missing value")
            else:
                raw = following
                i += 1
        if namespace[name] is None and name in types:
            namespace[name] = None if raw.strip().lower() in ("none", "null") else parse_value(name, raw, types[name])
        else:
            namespace[name] = parse_value(name, raw, namespace[name])
        namespace[name] = resolve_typed_path(name, namespace[name])
        i += 1
    return {n: namespace[n] for n in names}


class Stopped(KeyboardInterrupt):
    """SIGTERM (timeout, systemd, Slurm) or SIGHUP (the terminal or SSH session closed), raised where the script is,
    as Ctrl-C's KeyboardInterrupt is: the same clean-up runs (a build saves its position, encoder processes stop,
    temporary files go), then one line. The trainers catch these signals themselves while they train."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _stop_as_ctrl_c_does(signum: int, _frame: Any) -> None:
    if signum == signal.SIGHUP:
        from sparknet.common.runtime import quiet_closed_terminal

        quiet_closed_terminal()
    raise Stopped(signum)


def run_script(namespace: dict[str, Any], main: Callable[[], Any], argv: list[str] | None = None) -> None:
    """A script's entry point: apply the flags, run `main`; user mistakes and Ctrl-C (or SIGTERM, SIGHUP) become
    messages, not tracebacks, and a reader that goes away (`--help | head`) ends the script quietly."""
    _quiet_handed_over_disk_full()
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _stop_as_ctrl_c_does)
    try:
        try:
            from sparknet.config.checks import check_values

            check_values(apply_overrides(namespace, argv))  # before any work, import or data
            main()
        finally:
            sys.stdout.flush()  # here, so that a closed pipe is seen inside the try, not at interpreter exit
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(exc.exit_code) from None
    except KeyboardInterrupt as exc:
        signum = exc.signum if isinstance(exc, Stopped) else signal.SIGINT
        print(f"\ninterrupted by {signal.Signals(signum).name}: run the same command again", file=sys.stderr)
        raise SystemExit(128 + signum) from None
    except BrokenPipeError:
        # what is left in stdout's buffer would fail again at exit: point stdout at /dev/null (Python's docs' recipe)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        raise SystemExit(1) from None
    except Exception as exc:
        from sparknet.common.runtime import disk_full
        from sparknet.common.write_faults import write_fault

        where = disk_full(exc)
        if where is not None:
            # the runs and builds are written to resume from their last save: nothing else to do but make room
            print(f"error: no space left on the device writing {where}: free space, then run the same command again",
                  file=sys.stderr)
            raise SystemExit(1) from None
        fault = write_fault(exc)
        if fault is None:
            raise
        print(f"error: {fault}; then run the same command again", file=sys.stderr)
        raise SystemExit(1) from None


def _quiet_handed_over_disk_full() -> None:
    """A background writer that keeps its exception for the main thread (TensorBoard's event writer sets
    `thread.exception`, re-raised at the next write) dies on a full disk with a traceback of its own, before the
    main thread's one line: that traceback is left out. Any other thread's failure prints as Python prints it."""
    import threading

    default = threading.excepthook

    def hook(args: Any) -> None:
        from sparknet.common.runtime import disk_full

        handed_over = args.exc_value is not None and getattr(args.thread, "exception", None) is args.exc_value
        if handed_over and disk_full(args.exc_value) is not None:
            return
        default(args)

    threading.excepthook = hook


def constants_reference(scripts: list[str]) -> str:
    """docs/constants.md: each script's constants with their default, their comment (the one doc of a constant, as
    --help prints it) and the values their rule allows (sparknet.config.checks), as Markdown. Written by `make docs`;
    tests/test_docs.py fails when the file is not what the scripts say now."""
    from sparknet.common.runtime import PROJECT_ROOT
    from sparknet.config.checks import RULES

    out = ["# Script constants", "",
           "Every constant of every script, as its top says it: the default and the comment (what `--help` prints), "
           "and the values its check allows. Written from the scripts by `make docs`: edit the script, not this "
           "file. Each constant is also a flag: `--name value`.", ""]
    for script in scripts:
        helps = describe_constants((PROJECT_ROOT / "scripts" / script).read_text())
        values = script_constants(script)
        out += [f"## {script}", "", "| constant | default | what it is | allowed |", "|---|---|---|---|"]
        for name, value in values.items():
            shown = repr(value) if isinstance(value, str) else json.dumps(value)
            rule = RULES.get(name)
            allowed = rule.expected + (" (or None)" if rule.none else "") if rule else ""
            cells = [f"`{name}`", f"`{shown}`", helps.get(name, ""), allowed]
            out.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
        out.append("")
    return "\n".join(out)


def script_constants(script: str) -> dict[str, Any]:
    """The constants of `scripts/<script>` with their defaults as written there (the one source of defaults), read
    without running the script."""
    import importlib.util

    from sparknet.common.runtime import PROJECT_ROOT

    path = PROJECT_ROOT / "scripts" / script
    spec = importlib.util.spec_from_file_location(f"_sparknet_script_{path.stem}", path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # scripts only assign constants and define functions at import
    namespace = vars(module)
    return {name: namespace[name] for name in constant_names(namespace)}
