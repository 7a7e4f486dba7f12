"""Trains SparkNet's GPT-2-compatible byte-level BPE tokenizer on documents sampled from a mix config.

Documents are drawn from every source in proportion to its `prob`, one document at a time, each source streamed.
The result loads with `AutoTokenizer.from_pretrained(OUTPUT_DIR)`; `training_report.json` beside it records what
was sampled and the bytes per token on held-out text of each source.
"""

CONFIG = "configs/datasets_v5.json"  # mix config to sample documents from
VOCAB_SIZE = 50257  # vocabulary size, <|endoftext|> included (GPT-2's is 50257)
MAX_DOCS = 500_000  # documents sampled for training (the mix's proportions, by documents)
MIN_FREQUENCY = 2  # a pair must occur this often to be merged
HELDOUT_DOCS = 200  # documents per source after the sample, for the held-out bytes-per-token report
OUTPUT_DIR = "tokenizer-v5"  # folder written with save_pretrained
OVERWRITE = False  # replace an existing, non-empty OUTPUT_DIR


def main() -> None:
    from sparknet import runtime
    from sparknet.config import load_config

    config = load_config(CONFIG)
    runtime.setup(config.seed)
    from sparknet.tokenizer import train_tokenizer

    out = runtime.project_path(OUTPUT_DIR)
    report = train_tokenizer(config, out, VOCAB_SIZE, MAX_DOCS, MIN_FREQUENCY, HELDOUT_DOCS, OVERWRITE)
    print(f"tokenizer: {out} (vocab {report['vocab_size']}, {report['seconds']:.0f} s)")
    for label, s in report["sources"].items():
        bpt = s["heldout_bytes_per_token"]
        print(
            f"  {label:<24} {s['documents']:>8} docs {s['document_share']:6.1%} (asked {s['requested_share']:.1%})"
            f"  {s['bytes'] / 2**20:8.1f} MB  held-out bytes/token " + (f"{bpt:.2f}" if bpt else "n/a")
        )


if __name__ == "__main__":
    from sparknet.cli import run_script

    run_script(globals(), main)
