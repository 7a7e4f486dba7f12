"""The SparkNet demo: the whole chain on CPU, offline, in a few minutes, on text every Python installation has.

Runs the real scripts one after another, printing each command so you can run them yourself: demo corpus ->
tokenizer -> packed dataset. Every output goes to demo-only folders; your tokenizer-v5/ and datasets/ are never touched.
"""

CONFIG = "configs/demo.json"  # the demo's mix: stdlib docstrings (prose) and stdlib source (code)
CORPUS_DIR = "data/demo"  # demo corpus (JSONL), written by scripts/prepare_demo_corpus.py
TOKENIZER_DIR = "tokenizer-demo"  # the demo's tokenizer (never tokenizer-v5/)
VOCAB_SIZE = 8192  # a small vocabulary suits the ~12 MB demo corpus
TOKENIZER_DOCS = 800  # documents sampled for the tokenizer
DATASET_DIR = "datasets/demo"  # the demo's packed dataset (never datasets/sparknet-v5-1b/)
VAL_TOKENS = 50_000  # validation tokens held out from the demo mix


def main() -> None:
    from sparknet import runtime
    from sparknet.demo import Chain

    runtime.setup()
    chain = Chain()
    chain.step("demo corpus", "prepare_demo_corpus.py", "--output_dir", CORPUS_DIR)
    chain.step("tokenizer", "train_tokenizer_v5.py", "--config", CONFIG, "--vocab_size", VOCAB_SIZE,
               "--max_docs", TOKENIZER_DOCS, "--output_dir", TOKENIZER_DIR, "--overwrite", "true")
    chain.step("packed dataset", "build_dataset_v5.py", "--config", CONFIG, "--tokenizer_dir", TOKENIZER_DIR,
               "--output_dir", DATASET_DIR, "--val_tokens", VAL_TOKENS, "--overwrite", "true")
    chain.summary({
        "demo corpus": CORPUS_DIR,
        "tokenizer": f"{TOKENIZER_DIR}  (report: {TOKENIZER_DIR}/training_report.json)",
        "packed dataset": f"{DATASET_DIR}  (manifest: {DATASET_DIR}/manifest.json)",
    })


if __name__ == "__main__":
    from sparknet.cli import run_script

    run_script(globals(), main)
