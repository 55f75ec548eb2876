"""Small real models and tokenizers built offline, for tests and benchmarks (random weights, real code paths)."""
