"""The encoder processes (sparknet.data.encoding.encoder_pool): batches encoded as the tokenizer does in this process,
and a pool stopped at any moment stops at once, never waiting for good."""

from __future__ import annotations

import struct
import threading
from pathlib import Path

import numpy as np
import pytest

from sparknet.data.encoding.encoder_pool import EncoderPool


@pytest.fixture(scope="module")
def tokenizer(tokenizer_dir: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tokenizer_dir))


def test_a_batch_is_encoded_as_the_tokenizer_encodes_it_with_eos_after_each_document(tokenizer) -> None:
    texts = ["def main():\n    return 1", "The standard library.", ""]
    pool = EncoderPool(2, tokenizer.backend_tokenizer.to_str(), tokenizer.eos_token_id, np.dtype("uint16"))
    try:
        tokens, lengths = pool.submit(texts).get()
    finally:
        pool.close()
    expected = [[*tokenizer(text, add_special_tokens=False)["input_ids"], tokenizer.eos_token_id] for text in texts]
    assert lengths.tolist() == [len(e) for e in expected]
    assert tokens.dtype == np.uint16 and tokens.tolist() == [t for e in expected for t in e]


def test_a_pool_stopped_while_a_result_is_half_written_stops_at_once(tokenizer) -> None:
    """A worker stopped while it writes its result leaves half a message in the result pipe: the executor's thread
    used to wait for the rest for good, and the run with it (a streamed run hung after its hold-out). The half
    message is written here by hand, as a length header promising a megabyte and the first 100 bytes of it."""
    pool = EncoderPool(1, tokenizer.backend_tokenizer.to_str(), tokenizer.eos_token_id, np.dtype("uint16"))
    pool.submit(["the worker and the executor's thread are up"]).get()
    writer = pool._executor._result_queue._writer
    writer._send(struct.pack("!i", 2**20) + b"x" * 100)
    stopped = threading.Event()
    threading.Thread(target=lambda: (pool.terminate(), stopped.set()), daemon=True).start()
    if not stopped.wait(30):
        writer.close()  # lets the executor's thread (and this test session) end before failing
        pytest.fail("EncoderPool.terminate waited for the rest of a result that never comes")
