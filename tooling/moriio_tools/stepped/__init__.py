"""Both engines of a 1P1D pair stepped without pause: moriio against vLLM's NixlConnector with
its progress thread off (``moriio bench --stepped``)."""
