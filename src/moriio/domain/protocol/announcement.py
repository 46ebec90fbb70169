"""What an engine announces to a router's ping port: fields, their validation and the map form.

The protocol of vLLM's MoRIIO toy proxy. An engine sends, every few seconds, one map::

    {"type": "P" | "D", "http_address": "HOST:PORT",
     "zmq_address": "host:IP,handshake:PORT,notify:PORT",
     "dp_size": N, "tp_size": N, "transfer_mode": "READ" | "WRITE"}

``{"type": "HELLO"}`` announces nothing. The older form ``{"type": "register", "role": "P" |
"D", "request_address": "http://HOST:PORT/v1/completions", "handshake_port": N,
"notify_port": N, ...}`` is read too. The transport (msgpack over ZMQ) is the sender's and the
receiver's; every error here is an :class:`AnnouncementError` naming the field.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from moriio.domain.params.param_values import MAX_DP_SIZE
from moriio.domain.params.transfer_params import MAX_TP_SIZE
from moriio.domain.values.addresses import ControlAddress, ControlAddressError
from moriio.domain.values.hosts import MAX_PORT, InvalidHostError, canonical_host
from moriio.domain.values.modes import TransferMode

_HOST_PORT = re.compile(r"^(?:https?://)?([A-Za-z0-9.\-]+|\[[0-9A-Fa-f:.]+\]):(\d{1,5})(/.*)?$")
_MODES = {mode.name: mode for mode in TransferMode}


class AnnouncementError(ValueError):
    """A malformed announcement; the message names the field."""


@dataclass(frozen=True, slots=True)
class Announcement:
    """One engine as it announces itself: its HTTP server and its rank-0 control address.

    Hosts are kept canonical; a value out of range raises :class:`AnnouncementError`.
    """

    is_producer: bool
    http_host: str
    http_port: int
    host: str
    handshake_port: int
    notify_port: int
    dp_size: int
    tp_size: int
    mode: TransferMode

    def __post_init__(self) -> None:
        if type(self.is_producer) is not bool:
            raise AnnouncementError(f"type must be 'P' or 'D', got {self.is_producer!r:.40}")
        try:
            http_host = canonical_host(self.http_host)
        except InvalidHostError as exc:
            raise AnnouncementError(f"http_address has an invalid host: {exc}") from None
        if type(self.http_port) is not int or not 0 < self.http_port <= MAX_PORT:
            raise AnnouncementError(
                f"http_address must name a port in [1, {MAX_PORT}], got {self.http_port!r:.40}"
            )
        try:
            control = ControlAddress(self.host, self.handshake_port, self.notify_port)
        except ControlAddressError as exc:
            raise AnnouncementError(f"zmq_address: {exc}") from None
        object.__setattr__(self, "http_host", http_host)
        object.__setattr__(self, "host", control.host)
        _check_size(self.dp_size, "dp_size", MAX_DP_SIZE)
        _check_size(self.tp_size, "tp_size", MAX_TP_SIZE)
        if not isinstance(self.mode, TransferMode):
            raise AnnouncementError(f"transfer_mode must be READ or WRITE, got {self.mode!r:.40}")

    @property
    def control(self) -> ControlAddress:
        return ControlAddress(self.host, self.handshake_port, self.notify_port)

    def payload(self) -> dict[str, Any]:
        """The toy proxy's registration map, key for key."""
        return {
            "type": "P" if self.is_producer else "D",
            "http_address": http_address(self.http_host, self.http_port),
            "zmq_address": self.control.format(),
            "dp_size": self.dp_size,
            "tp_size": self.tp_size,
            "transfer_mode": self.mode.name,
        }

    @classmethod
    def from_payload(cls, data: object) -> Announcement | None:
        """The announcement in ``data`` (either form); None for a HELLO."""
        if not isinstance(data, Mapping):
            raise AnnouncementError("announcement must be a map")
        kind = data.get("type")
        if kind == "HELLO":
            return None
        if kind in ("P", "D"):
            is_producer = kind == "P"
            http_host, http_port = _host_port(data.get("http_address"), "http_address")
            try:
                control = ControlAddress.parse(data.get("zmq_address"))
            except ControlAddressError as exc:
                raise AnnouncementError(f"zmq_address: {exc}") from None
        elif kind == "register":
            role = data.get("role")
            if role not in ("P", "D"):
                raise AnnouncementError(f"role must be 'P' or 'D', got {role!r:.40}")
            is_producer = role == "P"
            http_host, http_port = _host_port(data.get("request_address"), "request_address")
            control = ControlAddress(
                http_host,
                _port(data.get("handshake_port"), "handshake_port"),
                _port(data.get("notify_port"), "notify_port"),
            )
        else:
            raise AnnouncementError(
                f"type must be 'P', 'D', 'register' or 'HELLO', got {kind!r:.40}"
            )
        mode = data.get("transfer_mode")
        if not isinstance(mode, str) or mode not in _MODES:
            raise AnnouncementError(f"transfer_mode must be READ or WRITE, got {mode!r:.40}")
        return cls(
            is_producer=is_producer,
            http_host=http_host,
            http_port=http_port,
            host=control.host,
            handshake_port=control.handshake_port,
            notify_port=control.notify_port,
            dp_size=data.get("dp_size", 1),
            tp_size=data.get("tp_size", 1),
            mode=_MODES[mode],
        )


def http_address(host: str, port: int) -> str:
    """``HOST:PORT``, an IPv6 host in brackets (as in a URL)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _host_port(value: object, what: str) -> tuple[str, int]:
    match = _HOST_PORT.match(value) if isinstance(value, str) else None
    if match is None:
        raise AnnouncementError(f"{what} must be 'HOST:PORT', got {value!r:.80}")
    try:
        host = canonical_host(match.group(1).removeprefix("[").removesuffix("]"))
    except InvalidHostError as exc:
        raise AnnouncementError(f"{what} has an invalid host: {exc}") from None
    return host, _port(match.group(2), what)


def _port(value: object, what: str) -> int:
    """A port given as an int or as decimal digits."""
    if isinstance(value, str) and value.isascii() and value.isdigit() and len(value) <= 5:
        value = int(value)
    if type(value) is not int or not 0 < value <= MAX_PORT:
        raise AnnouncementError(f"{what} must be a port in [1, {MAX_PORT}], got {value!r:.40}")
    return value


def _check_size(value: object, what: str, maximum: int) -> None:
    if type(value) is not int or not 1 <= value <= maximum:
        raise AnnouncementError(f"{what} must be an integer in [1, {maximum}], got {value!r:.40}")
