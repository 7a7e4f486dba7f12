"""Another corpus for bench/recipe.py, from text a Debian-based machine already has: does a recipe tuned on the demo's
Python text keep its lead on text it was not tuned on?

Two sources, written as JSONL ({"text": ...} per line) into OUTPUT_DIR with a mix config beside them: `changelog`
(every package's changelog.Debian.gz under /usr/share/doc: English release notes in a fixed layout) and `licence`
(the packages' copyright files and /usr/share/common-licenses: legal English), each document once (identical files
are common among copyright files), capped at MAX_DOC_KB, split into train and held-out validation by a hash of the
package name. Then, as the demo does, a tokenizer and a packed dataset:

    python bench/other_corpus.py
    python scripts/train_tokenizer_v5.py --config data/other/mix.json --vocab_size 8192 --max_bytes 4000000 \
        --output_dir tokenizer-other
    python scripts/build_dataset_v5.py --config data/other/mix.json --tokenizer_dir tokenizer-other \
        --output_dir datasets/other --val_tokens 25000
    python bench/recipe.py --dataset_dir datasets/other \
        --held_out '{"changelog": "data/other/changelog.val.jsonl", "licence": "data/other/licence.val.jsonl"}'
"""

from __future__ import annotations

import gzip
import hashlib
import json
from pathlib import Path

OUTPUT_DIR = "data/other"  # where changelog/licence .train/.val .jsonl files and mix.json are written
DOC_DIR = "/usr/share/doc"  # the packages' documentation
LICENSES_DIR = "/usr/share/common-licenses"  # the full licence texts
MAX_DOC_KB = 64  # a document's cap (a few changelogs run to megabytes)
VAL_PERCENT = 5  # share of packages held out for validation
TARGET_TOKENS = 1_000_000  # the mix config's training tokens (the demo's)


def documents() -> dict[str, list[tuple[str, str]]]:
    """{source: [(key, text)]}: each changelog and each distinct copyright or licence text, keyed by package."""
    docs: dict[str, list[tuple[str, str]]] = {"changelog": [], "licence": []}
    seen: set[str] = set()
    for package in sorted(Path(DOC_DIR).iterdir()):
        changelog, copyright_file = package / "changelog.Debian.gz", package / "copyright"
        if changelog.is_file():
            docs["changelog"].append((package.name, gzip.decompress(changelog.read_bytes()).decode("utf-8", "replace")))
        if copyright_file.is_file():
            docs["licence"].append((package.name, copyright_file.read_text("utf-8", "replace")))
    licences = Path(LICENSES_DIR)
    if licences.is_dir():
        docs["licence"] += [(f"common-{p.name}", p.read_text("utf-8", "replace")) for p in sorted(licences.iterdir())
                            if p.is_file()]
    for source, items in docs.items():
        unique = []
        for key, text in items:
            text = text[: MAX_DOC_KB * 1024].strip()
            digest = hashlib.sha256(text.encode()).hexdigest()
            if text and digest not in seen:
                seen.add(digest)
                unique.append((key, text))
        docs[source] = unique
    return docs


def main() -> None:
    out = Path(__file__).resolve().parent.parent / OUTPUT_DIR
    out.mkdir(parents=True, exist_ok=True)
    for source, items in documents().items():
        split = {"train": [], "val": []}
        for key, text in items:
            held_out = int(hashlib.sha256(key.encode()).hexdigest(), 16) % 100 < VAL_PERCENT
            split["val" if held_out else "train"].append(text)
        for name, texts in split.items():
            (out / f"{source}.{name}.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
            print(f"{source}.{name}: {len(texts)} documents, {sum(len(t.encode()) for t in texts) / 2**20:.1f} MB")
    mix = [{"name": "json", "split": "train", "prob": 0.5, "data_files": f"{OUTPUT_DIR}/{source}.train.jsonl"}
           for source in ("changelog", "licence")]
    config = {"seed": 42, "context_length": 256, "target_tokens": TARGET_TOKENS, "mix": mix}
    (out / "mix.json").write_text(json.dumps(config, indent=2) + "\n")
    print(f"mix config: {OUTPUT_DIR}/mix.json")


if __name__ == "__main__":
    from sparknet.config.cli import run_script

    run_script(globals(), main)
