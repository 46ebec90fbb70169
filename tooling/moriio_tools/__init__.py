"""The workshop around moriio, not shipped with it: built on the library, never imported by it.

``cli`` holds ``moriio demo`` and ``moriio bench`` (found by the ``moriio`` command through the
``moriio.commands`` entry points), ``bench`` the benchmark sections (planner, transport,
control channel, scheduler, chaos), ``serve`` the deployment driver (``vllm serve``
processes, router, the peers' deployments), ``soak`` a deployment kept under traffic, kills
and cancels, ``stepped`` engines stepped without pause, ``sim`` the seeded simulation of a
cluster, ``models`` the tiny seeded models (the zoo) and ``prompts`` the prompt sets they
are served.
``harness`` (and ``vllm_harness``, which imports vLLM) re-exports what moriio's tests use; its
own tests are in ``tooling/tests``.
"""
