"""Test kits for code built on the moriio core.

``inmemory`` holds fakes of the ports that copy real bytes (and an adapter container wiring
them), ``chaos`` wrappers that inject seeded faults into any engine or channel (the one way to
fault a channel), ``contract`` the TransferEngine and ControlChannel contracts any engine or
channel can be checked against, ``fences`` a hand-driven source of device fences,
``fake_stream`` a device stream that runs layer-gate waits and writes only when told. Not part
of the production path: the connector loads the chaos wiring by name only when ``chaos_seed``
is set.
"""
