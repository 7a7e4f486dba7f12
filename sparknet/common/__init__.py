"""What every stage stands on, importing nothing else of SparkNet: the user's errors, the runtime (devices, threads,
paths, atomic writes), progress bars, one-writer locks, write faults, folder-or-Hub names and output checks. The
name is nanochat's for the same job (`nanochat/common.py`)."""
