"""Test kits for code built on the moriio core.

``inmemory`` holds fakes of the ports that copy real bytes (and an adapter container that
fills the composition root's slots with them), ``contract`` the TransferEngine and
ControlChannel contracts any engine or channel can be checked against, ``stacks`` workers on
those fakes behind the chaos wrappers (:mod:`moriio.adapters.chaos`), ``fences`` a
hand-driven source of device fences, ``fake_stream`` a device stream that runs layer-gate
waits and writes only when told. Not part of the production path (an import-linter contract
checks it).
"""
