"""The ``moriio`` command's tools, built on the library: not imported by the connector.

``bench`` holds the benchmark sections (planner, transport, control channel, scheduler,
chaos), ``serve`` the demo's deployment driver (router, registry, ``vllm serve`` processes),
``doctor`` the preflight checks, ``soak`` a deployment kept under traffic, kills and cancels,
``models`` the tiny seeded models (the zoo) and ``prompts`` the prompt sets they are served;
``plan`` is the plan explainer, ``output`` the output helpers. The ``moriio`` command
(:mod:`moriio.cli`) parses arguments and calls into them.
"""
