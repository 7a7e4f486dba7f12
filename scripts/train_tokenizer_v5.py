"""Trains SparkNet's GPT-2-compatible byte-level BPE tokenizer on text sampled from a mix config.

Text is drawn from every source in proportion to its `prob` by UTF-8 bytes (not documents, so that a source of long
documents supplies its share of the text and no more), one whole document at a time. Each source is streamed
through the same seeded shuffle buffer as build_dataset_v5.py, so the tokenizer sees the mix the model will see.
The result loads with `AutoTokenizer.from_pretrained(OUTPUT_DIR)`; `training_report.json` beside it records what
was sampled and the bytes per token on held-out text of each source.
"""

CONFIG = "configs/datasets_v5.json"  # mix config to sample text from
VOCAB_SIZE = 50257  # vocabulary size, <|endoftext|> included (GPT-2's is 50257)
MAX_BYTES = 2_000_000_000  # bytes of text sampled for training, the mix's proportions by bytes
SHUFFLE_BUFFER = 10_000  # documents per source in a shuffle buffer, as build_dataset_v5.py (0: each source's order)
HUB_RETRY_MINUTES = 15.0  # a Hub source that fails (429, 5xx, a dropped connection) is retried this long
MIN_FREQUENCY = 2  # a pair must occur this often to be merged
HELDOUT_DOCS = 200  # documents per source after the sample, for the held-out bytes-per-token report
OUTPUT_DIR = "tokenizer-v5"  # folder written with save_pretrained
OVERWRITE = False  # replace an existing, non-empty OUTPUT_DIR


def main() -> None:
    from sparknet.common import runtime
    from sparknet.common.outputs import Output, check_outputs
    from sparknet.config.mix import load_config

    check_outputs(Output("OUTPUT_DIR", runtime.project_path(OUTPUT_DIR), locked=True))
    config = load_config(CONFIG)
    runtime.setup(config.seed)
    from sparknet.data.source.hub_retries import set_hub_retry_minutes

    set_hub_retry_minutes(HUB_RETRY_MINUTES)
    from sparknet.bpe import train_tokenizer

    out = runtime.project_path(OUTPUT_DIR)
    report = train_tokenizer(config, out, vocab_size=VOCAB_SIZE, max_bytes=MAX_BYTES, min_frequency=MIN_FREQUENCY,
                             heldout_docs=HELDOUT_DOCS, shuffle_buffer=SHUFFLE_BUFFER, overwrite=OVERWRITE)
    print(f"tokenizer: {out} (vocab {report['vocab_size']}, {report['seconds']:.0f} s)")
    for label, s in report["sources"].items():
        bpt = s["heldout_bytes_per_token"]
        column = f"  column {s['text_column']!r}" if s.get("text_column") else ""
        print(
            f"  {label:<24} {s['bytes'] / 2**20:8.1f} MB {s['byte_share']:6.1%} (asked {s['requested_share']:.1%})"
            f"  {s['documents']:>8} docs  held-out bytes/token " + (f"{bpt:.2f}" if bpt else "n/a") + column
        )


if __name__ == "__main__":
    from sparknet.config.cli import run_script

    run_script(globals(), main)
