"""Writes the demo corpus: local JSONL ({"text": ...} per line) from text every Python installation already has.

Two sources: `prose` (the standard library's module, class and function docstrings, plus the language reference's
help topics) and `code` (the standard library's source, cut into pieces of a few kB at top-level definitions), each
split into train and a held-out validation part by a hash of the file name. Deterministic for a given Python
version; no network; a few seconds.
"""

OUTPUT_DIR = "data/demo"  # where prose/code .train/.val .jsonl files are written
MAX_CODE_MB = 20.0  # cap on the code source's size (the stdlib holds about 30 MB of code)
MAX_FILE_KB = 200  # skip source files larger than this (generated tables, not code people write)
VAL_PERCENT = 5  # share of files held out for validation
INCLUDE_TESTS = False  # include the stdlib's own test suite (mostly boilerplate)


def main() -> None:
    from sparknet.common import runtime
    from sparknet.common.outputs import Output, check_outputs
    from sparknet.demo.corpus import write_demo_corpus

    check_outputs(Output("OUTPUT_DIR", runtime.project_path(OUTPUT_DIR)))
    runtime.setup()
    write_demo_corpus(
        runtime.project_path(OUTPUT_DIR),
        max_code_bytes=int(MAX_CODE_MB * 2**20),
        max_file_bytes=MAX_FILE_KB * 1024,
        val_percent=VAL_PERCENT,
        include_tests=INCLUDE_TESTS,
    )


if __name__ == "__main__":
    from sparknet.config.cli import run_script

    run_script(globals(), main)
