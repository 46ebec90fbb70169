"""Both engines of a 1P1D pair stepped as vLLM's engine core steps them: moriio against vLLM's
NixlConnector with its progress thread off, per configuration of cores and OpenMP threads
(``moriio bench --stepped``)."""
