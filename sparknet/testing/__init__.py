"""Support for SparkNet's tests and benchmarks, shipped with the package so that both import it (as
`transformers.testing_utils` is): a Hugging Face Hub look-alike on loopback (hub_server)."""
