"""SparkNet: train compact GPT-2-style causal language models from scratch on the Hugging Face stack.

Importing the package is cheap on purpose: scripts parse flags and validate configs before the heavy libraries
(torch, transformers, datasets) are imported, so `--help` and user mistakes answer in well under a second.
"""

__version__ = "0.1.0"
