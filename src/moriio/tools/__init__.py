"""Bench and demo harnesses built on the library: not imported by the connector.

``bench`` holds the benchmark sections (planner, transport, control channel, scheduler,
chaos), ``pd`` the in-process P/D harness (engine processes, proxy, runner), ``serve`` the
deployment driver (router, registry, ``vllm serve`` processes), ``doctor`` the preflight
checks, ``plan`` the plan explainer. The ``moriio`` command (:mod:`moriio.cli`) parses
arguments and calls into them.
"""
