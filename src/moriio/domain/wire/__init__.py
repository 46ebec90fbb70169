"""Everything that crosses a process boundary, parsed and validated once.

Peer messages and their msgpack codec, the handshake, ``kv_transfer_params`` from routers,
host syntax, and the per-step orders the scheduler sends its workers.
"""
