"""The licence ids the Hugging Face Hub accepts in a card's `license:` field (EXPORT's LICENSE is checked against
them before any work: a misspelt id would be published as is, and the Hub would show the model as unlicensed).

Copied from the Hub's documentation, "Licenses" (https://huggingface.co/docs/hub/repositories-licenses; its source,
huggingface/hub-docs docs/hub/repositories-licenses.md, at commit fd6cf1f56e15, 2026-06-06), in its order. A newer
id missing here is refused: add it from that page.
"""

from __future__ import annotations

HUB_LICENSES: tuple[str, ...] = (
    "apache-2.0", "mit", "openrail", "bigscience-openrail-m", "creativeml-openrail-m", "bigscience-bloom-rail-1.0",
    "bigcode-openrail-m", "afl-3.0", "artistic-2.0", "bsl-1.0", "bsd", "bsd-2-clause", "bsd-3-clause",
    "bsd-3-clause-clear", "c-uda", "cc", "cc0-1.0", "cc-by-2.0", "cc-by-2.5", "cc-by-3.0", "cc-by-4.0",
    "cc-by-sa-3.0", "cc-by-sa-4.0", "cc-by-nc-2.0", "cc-by-nc-3.0", "cc-by-nc-4.0", "cc-by-nd-4.0", "cc-by-nc-nd-3.0",
    "cc-by-nc-nd-4.0", "cc-by-nc-sa-2.0", "cc-by-nc-sa-3.0", "cc-by-nc-sa-4.0", "cdla-sharing-1.0",
    "cdla-permissive-1.0", "cdla-permissive-2.0", "wtfpl", "ecl-2.0", "epl-1.0", "epl-2.0", "etalab-2.0", "eupl-1.1",
    "eupl-1.2", "agpl-3.0", "gfdl", "gpl", "gpl-2.0", "gpl-3.0", "lgpl", "lgpl-2.1", "lgpl-3.0", "isc", "h-research",
    "intel-research", "lppl-1.3c", "ms-pl", "apple-ascl", "apple-amlr", "mpl-2.0", "odc-by", "odbl", "openmdw-1.0",
    "openmdw-1.1", "openrail++", "osl-3.0", "postgresql", "ofl-1.1", "ncsa", "unlicense", "zlib", "pddl", "lgpl-lr",
    "deepfloyd-if-license", "fair-noncommercial-research-license", "llama2", "llama3", "llama3.1", "llama3.2",
    "llama3.3", "llama4", "grok2-community", "gemma", "unknown", "other",
)
LICENSES_PAGE = "https://huggingface.co/docs/hub/repositories-licenses"
