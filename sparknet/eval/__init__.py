"""Evaluation: metrics, the models evaluated, perplexity, generation, evaluation data, benchmarks, reports and plots."""
