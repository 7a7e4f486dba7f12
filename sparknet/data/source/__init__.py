"""A source: one mix entry opened as a lazy stream of texts (opening), read through the Hub's transient failures
(hub_retries), and read for one rank with an exact, restorable position (rank_reader)."""
