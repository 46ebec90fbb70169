"""Preflight checks of ``moriio doctor``: local environment and a live peer."""
