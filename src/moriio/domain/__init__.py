"""The pure core of moriio, by concept, top layer first (import-linter enforces the order).

- ``worker``: worker-side services (producer, consumer, poster, peers, progress).
- ``scheduler``: scheduler-side books that turn vLLM's decisions into orders.
- ``wire``: what crosses a process boundary (peer messages, ``kv_transfer_params``, orders).
- ``ledgers``: release bookkeeping for both transfer modes.
- ``kv``: cache layouts, the planner and its plan cache, TP mapping.
- ``timing``: timeout and retry policy, deadline queues.
"""
