"""Benchmark sections of ``moriio bench``, each measured next to its reference."""
