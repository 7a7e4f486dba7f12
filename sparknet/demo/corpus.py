"""The demo corpus: English prose and Python code taken from the standard library of the running Python.

Every machine with Python has this text, so the demo and the tests need no download. Files are visited in sorted
order and split by a hash of their relative path, so the output is the same on every run of the same Python.
"""

from __future__ import annotations

import ast
import hashlib
import json
import logging
import os
import sysconfig
import warnings
from collections.abc import Iterator
from pathlib import Path

from sparknet.common.progress import progress

log = logging.getLogger(__name__)

# encodings/ holds generated codec tables (0x00 mappings), not code anyone writes
SKIP_DIRS = {"site-packages", "dist-packages", "__pycache__", "idlelib", "turtledemo", "lib2to3", "ensurepip",
             "encodings"}
TEST_DIRS = {"test", "tests", "idle_test"}


def stdlib_files(include_tests: bool = False, max_file_bytes: int = 200 * 1024) -> list[Path]:
    """The standard library's .py files, sorted by relative path."""
    root = Path(sysconfig.get_paths()["stdlib"])
    skip = SKIP_DIRS | (set() if include_tests else TEST_DIRS)
    files = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in skip)
        for name in sorted(filenames):
            path = Path(dirpath) / name
            if name.endswith(".py") and path.stat().st_size <= max_file_bytes:
                files.append(path)
    return sorted(files, key=lambda p: p.relative_to(root).as_posix())


def docstrings(source: str, module: str) -> str:
    """The module, class and function docstrings of one file as one document, each under its qualified name."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SyntaxWarning)  # old escape sequences in stdlib docstrings
        tree = ast.parse(source)
    parts = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                name = f"{prefix}.{child.name}"
                doc = ast.get_docstring(child)
                if doc and len(doc) > 40:
                    parts.append(f"{name}\n\n{doc}")
                visit(child, name)

    head = ast.get_docstring(tree)
    if head:
        parts.append(f"{module}\n\n{head}")
    visit(tree, module)
    return "\n\n".join(parts)


def code_chunks(source: str, min_chars: int = 2000) -> list[str]:
    """A source file cut before top-level definitions into pieces of at least `min_chars` (the last may be
    shorter): documents of a few kB, like web text, rather than files of up to 200 kB."""
    chunks, current, size = [], [], 0
    for line in source.splitlines(keepends=True):
        if size >= min_chars and line.startswith(("def ", "class ", "async def ", "@")):
            chunks.append("".join(current))
            current, size = [], 0
        current.append(line)
        size += len(line)
    if current:
        chunks.append("".join(current))
    return [c for c in chunks if c.strip()]


def help_topics() -> Iterator[tuple[str, str]]:
    """The language reference's help topics (`help('if')`), as (key, text)."""
    from pydoc_data.topics import topics

    for key in sorted(topics):
        yield key, topics[key]


def _is_val(key: str, val_percent: int) -> bool:
    return int(hashlib.sha256(key.encode()).hexdigest(), 16) % 100 < val_percent


def write_demo_corpus(
    out_dir: Path,
    max_code_bytes: int = 20 * 2**20,
    max_file_bytes: int = 200 * 1024,
    val_percent: int = 2,
    include_tests: bool = False,
) -> dict[str, dict[str, int]]:
    """Writes prose/code × train/val JSONL files into `out_dir`; returns documents and bytes per file.

    Each file is written under a temporary name and renamed, so an interrupted run leaves no partial corpus.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    root = Path(sysconfig.get_paths()["stdlib"])
    names = [f"{src}.{split}" for src in ("prose", "code") for split in ("train", "val")]
    tmp = {n: out_dir / f".{n}.jsonl.tmp" for n in names}
    handles = {n: tmp[n].open("w", encoding="utf-8") for n in names}
    stats = {n: {"documents": 0, "bytes": 0} for n in names}

    def emit(source: str, key: str, text: str) -> None:
        name = f"{source}.{'val' if _is_val(key, val_percent) else 'train'}"
        handles[name].write(json.dumps({"text": text}, ensure_ascii=False) + "\n")
        stats[name]["documents"] += 1
        stats[name]["bytes"] += len(text.encode("utf-8"))

    try:
        for key, text in help_topics():
            emit("prose", f"topic:{key}", text)
        code_bytes = 0
        for path in progress(stdlib_files(include_tests, max_file_bytes), desc="demo corpus", unit="file"):
            rel = path.relative_to(root).as_posix()
            try:
                source = path.read_text(encoding="utf-8")
                prose = docstrings(source, rel[:-3].replace("/", ".").removesuffix(".__init__"))
            except (UnicodeDecodeError, SyntaxError, ValueError):
                continue  # a few stdlib files are deliberately broken test fixtures
            if prose:
                emit("prose", rel, prose)
            if source.strip() and code_bytes < max_code_bytes:
                for chunk in code_chunks(source):
                    emit("code", rel, chunk)  # split by file: all chunks of a file go to the same side
                code_bytes += len(source.encode("utf-8"))
    finally:
        for h in handles.values():
            h.close()
    for n in names:
        os.replace(tmp[n], out_dir / f"{n}.jsonl")
    total = sum(s["bytes"] for s in stats.values())
    log.info(
        "demo corpus in %s: %.1f MB; %s",
        out_dir,
        total / 2**20,
        ", ".join(f"{n} {s['documents']} docs {s['bytes'] / 2**20:.1f} MB" for n, s in stats.items()),
    )
    return stats
