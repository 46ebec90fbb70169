"""Peer addresses and transfer ids that routers embed in request ids.

vLLM's MoRIIO toy proxy (and routers that copy it) name a request::

    ___prefill_addr_host:IP,handshake:PORT,notify:PORT___decode_addr_host:...,notify:PORT_<32 hex>

and vLLM only prefixes and suffixes that id on each engine.
"""

from __future__ import annotations

import re

from moriio.domain.values.addresses import ControlAddress

_PREFILL_MARK = "___prefill_addr_"
_DECODE_MARK = "___decode_addr_"
_DECODE_ADDR = re.compile(r"___decode_addr_(.+)_[0-9a-f]{32}(?:-.*)?$")
# The 32-hex id that ends a router's request id (vLLM appends "-<n>-<hex>" on each side).
_ROUTER_ID = re.compile(r"___decode_addr_.+_([0-9a-f]{32})(?:-.*)?$")


def request_id_with_addresses(
    prefill: ControlAddress, decode: ControlAddress, transfer_id: str
) -> str:
    """The toy proxy's request id: both engines' control addresses, then ``transfer_id``."""
    return f"{_PREFILL_MARK}{prefill.format()}{_DECODE_MARK}{decode.format()}_{transfer_id}"


def transfer_id_from_request_id(request_id: str) -> str | None:
    """The id a router embedding both peers' addresses gave both legs of a request.

    Routers that set no ``transfer_id`` (older MoRIIO toy proxies) still send the same
    ``___prefill_addr_…___decode_addr_…_<32 hex>`` request id to both engines; vLLM only
    prefixes and suffixes it, so the 32 hex digits identify the transfer on both sides.
    """
    match = _ROUTER_ID.search(request_id)
    return match.group(1) if match else None


def peer_address_from_request_id(request_id: str, *, want_decode: bool) -> str | None:
    """The embedded address of the decode (``want_decode``) or prefill peer, if any."""
    if want_decode:
        start = request_id.find(_DECODE_MARK)
        match = _DECODE_ADDR.match(request_id, start) if start >= 0 else None
        return match.group(1) if match else None
    _, mark, rest = request_id.partition(_PREFILL_MARK)
    if not mark:
        return None
    address, mark, _ = rest.partition(_DECODE_MARK)
    if address and mark:
        return address
    end = rest.find(_DECODE_MARK, 1)  # the address is never empty
    return rest[:end] if end > 0 else None
