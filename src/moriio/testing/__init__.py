"""Test kits for code built on the moriio core: in-memory fakes of the ports and chaos wrappers.

Not part of the production path: the connector never imports this package unless a setting
opts into it (``chaos_seed``).
"""
