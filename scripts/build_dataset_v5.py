"""Builds the static packed dataset: the mix's sources streamed, encoded, mixed by tokens and packed into blocks.

Each source gets `prob × TARGET_TOKENS` tokens, interleaved document by document so that any prefix carries the mix.
Every document is followed by <|endoftext|>; blocks are contiguous (no padding; only the final partial block is
dropped). The validation split comes first from the same mix and shares no document with train. The output folder
holds memory-mappable token files and manifest.json (written last): no manifest, no dataset. An interrupted build
(Ctrl-C, a crash, kill -9) goes on from its last saved position when the same command runs again, and gives the
same files as an uninterrupted one.
"""

CONFIG = "configs/datasets_v5.json"  # mix config
TOKENIZER_DIR = "tokenizer-v5"  # tokenizer folder or Hub id (e.g. gpt2)
OUTPUT_DIR = "datasets/sparknet-v5-1b"  # dataset folder
TARGET_TOKENS: int | None = None  # training tokens (None: the config's target_tokens)
# validation tokens, whole blocks (None: 1 per 100 bytes of the sources, at most a tenth of the config's target_tokens
# and 2M; the stream's rule, and the same for every TARGET_TOKENS so that a dataset grows)
VAL_TOKENS: int | None = None
BLOCK_SIZE: int | None = None  # tokens per training block (None: the config's context_length)
NUM_WORKERS: int | None = None  # tokenizer processes (None: all cores; 0: encode in this process)
SEED: int | None = None  # seed of the per-source shuffle (None: the config's seed)
# documents shuffled per source through a buffer (0: keep each source's order; None: 1/20 of the smallest source's
# rows, at most 10,000: the stream's rule)
SHUFFLE_BUFFER: int | None = None
DTYPE = "auto"  # token dtype on disk: auto (uint16 when the vocab fits), uint16 or uint32
ON_EXHAUSTED = "renormalise"  # a source runs dry: renormalise (the others fill in, a warning), stop, restart, or fail
OVERWRITE = False  # replace an existing dataset built from other inputs
READ_AHEAD: int | None = None  # batches read ahead per source on a thread (None: 8 for Hub sources, 0 for local)
CHECKPOINT_SECONDS = 60.0  # save the build's position this often, for a resume after an interruption (0: never)
HUB_RETRY_MINUTES = 15.0  # a Hub source that fails (429, 5xx, a dropped connection) is retried this long


def main() -> None:
    from sparknet.common import runtime
    from sparknet.common.outputs import Output, check_outputs
    from sparknet.config.mix import load_config

    check_outputs(Output("OUTPUT_DIR", runtime.project_path(OUTPUT_DIR), locked=True))
    config = load_config(CONFIG)
    seed = config.seed if SEED is None else SEED
    runtime.setup(seed)
    from sparknet.data.source.hub_retries import set_hub_retry_minutes

    set_hub_retry_minutes(HUB_RETRY_MINUTES)
    from sparknet.common.runtime import available_cores
    from sparknet.data.packed.build import BuildSpec, build_dataset

    spec = BuildSpec(
        config=config,
        tokenizer=TOKENIZER_DIR,
        output_dir=runtime.project_path(OUTPUT_DIR),
        target_tokens=config.target_tokens if TARGET_TOKENS is None else TARGET_TOKENS,
        val_tokens=VAL_TOKENS,
        block_size=config.context_length if BLOCK_SIZE is None else BLOCK_SIZE,
        seed=seed,
        num_workers=available_cores() if NUM_WORKERS is None else NUM_WORKERS,
        dtype=DTYPE,
        shuffle_buffer=SHUFFLE_BUFFER,
        on_exhausted=ON_EXHAUSTED,
        overwrite=OVERWRITE,
        checkpoint_seconds=CHECKPOINT_SECONDS,
        read_ahead=READ_AHEAD,
    )
    manifest = build_dataset(spec)
    print(f"dataset: {spec.output_dir}  ({manifest['build_seconds']:.0f} s to build)")
    for split, info in manifest["splits"].items():
        print(
            f"  {split}: {info['blocks']} blocks of {manifest['block_size']} = {info['tokens']:,} tokens (each "
            f"document's <|endoftext|> included), {info['documents']:,} documents"
        )
        columns = manifest.get("text_columns", {})
        for label, s in info["sources"].items():
            column = f"  column {columns[label]!r}" if columns.get(label) else ""
            print(f"    {label:<24} {s['tokens']:>14,} tokens  {s['share']:6.2%} (asked {s['requested_share']:.2%})"
                  f"{column}")
        for phase in info.get("phases", []):  # a config in phases: each phase's blocks and mix
            first, end = phase["blocks"]
            where = f"blocks {first}-{end - 1}" if end > first else "no blocks (its sources ran dry before it)"
            print(f"    phase {phase['name']}: {where}, {phase['tokens']:,} tokens")
            for label, s in phase["sources"].items():
                print(f"      {label:<22} {s['tokens']:>14,} tokens  {s['share']:6.2%} (asked "
                      f"{s['requested_share']:.2%})")


if __name__ == "__main__":
    from sparknet.config.cli import run_script

    run_script(globals(), main)
