"""Engine processes: one vLLM engine core each, in-process, behind a command connection.

:mod:`~moriio_tools.engines.protocol` says what goes over the connection,
:mod:`~moriio_tools.engines.engine_process` is the orchestrator's handle (the process itself
runs as a :class:`~moriio_tools.serve.processes.ManagedProcess`),
:mod:`~moriio_tools.engines.engine_main` is the process's main, stepping its engine when busy or
without pause, :mod:`~moriio_tools.engines.spans` times a worker's transfers and
:mod:`~moriio_tools.engines.prompt_sources` counts where prompt tokens came from.
``moriio bench --stepped`` and the tests' 1P1D engine runs use them alike.
"""
