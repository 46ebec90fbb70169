"""Adapters: the ports implemented over third-party libraries (and in-memory fakes)."""
