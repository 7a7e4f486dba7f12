"""docs/constants.md from the scripts' constants (sparknet.config.cli.constants_reference): the comment on a constant at
the top of its script is its one doc, which --help prints and this file shows.

    python tools/constants_doc.py write   # `make docs`
    python tools/constants_doc.py check   # exit 1 when docs/constants.md is not what the scripts say now
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run as a script: the package beside it

from sparknet.config.cli import constants_reference  # noqa: E402

DOC = ROOT / "docs" / "constants.md"
# in the order a user meets them (docs/scripts.md's table)
SCRIPTS = ["prepare_demo_corpus.py", "train_tokenizer_v5.py", "build_dataset_v5.py", "train_sparknet_v5.py",
           "train_sparknet.py", "eval_perplexity.py", "eval_generation.py", "eval_benchmarks.py", "export_model.py",
           "plot_runs.py", "demo.py"]


def main(argv: list[str]) -> int:
    text = constants_reference(SCRIPTS)
    if argv[1:] == ["write"]:
        DOC.write_text(text)
        return 0
    if argv[1:] == ["check"]:
        if DOC.is_file() and DOC.read_text() == text:
            return 0
        print(f"{DOC.relative_to(ROOT)} is not what the scripts say: run `make docs`", file=sys.stderr)
        return 1
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
