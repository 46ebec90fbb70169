"""An engine's control address ``host:IP,handshake:PORT,notify:PORT``: its one format and parser.

Routers announce it (``zmq_address``) and embed it in request ids; engines dial the host at
the two ports (the bases of their rank-0 worker). Each segment splits on its first colon, so
IPv6 hosts need no brackets. Nothing is trimmed: a stray space is an error, as elsewhere on
the wire.
"""

from __future__ import annotations

from dataclasses import dataclass

from moriio.domain.values.hosts import MAX_PORT, InvalidHostError, canonical_host

PARTS = ("host", "handshake", "notify")
MAX_ADDRESS_LEN = 300  # a 253-character host name and two ports fit


class ControlAddressError(ValueError):
    """A malformed control address; ``part`` names what is wrong: ``host``, ``handshake``,
    ``notify`` or ``address`` (the shape of the whole)."""

    def __init__(self, part: str, message: str) -> None:
        super().__init__(message)
        self.part = part


@dataclass(frozen=True, slots=True)
class ControlAddress:
    """Where an engine takes handshakes and notifications; the host is kept canonical."""

    host: str
    handshake_port: int
    notify_port: int

    def __post_init__(self) -> None:
        try:
            host = canonical_host(self.host)
        except InvalidHostError as exc:
            raise ControlAddressError("host", f"control address host: {exc}") from None
        object.__setattr__(self, "host", host)
        for part, port in (("handshake", self.handshake_port), ("notify", self.notify_port)):
            if type(port) is not int or not 0 < port <= MAX_PORT:
                raise ControlAddressError(
                    part, f"control address {part} must be a port 1..{MAX_PORT}, got {port!r:.40}"
                )

    def format(self) -> str:
        """The wire form, ``host:IP,handshake:PORT,notify:PORT``."""
        return f"host:{self.host},handshake:{self.handshake_port},notify:{self.notify_port}"

    @classmethod
    def parse(cls, text: object) -> ControlAddress:
        """The address ``text`` spells; raises :class:`ControlAddressError` naming the part."""
        if not isinstance(text, str) or len(text) > MAX_ADDRESS_LEN:
            raise ControlAddressError(
                "address",
                f"control address must be a string of at most {MAX_ADDRESS_LEN} characters "
                f"'host:IP,handshake:PORT,notify:PORT', got {text!r:.80}",
            )
        parts: dict[str, str] = {}
        for segment in text.split(","):
            key, sep, value = segment.partition(":")
            if not sep or key not in PARTS or key in parts:
                raise ControlAddressError(
                    "address",
                    f"control address {text!r:.80} has a malformed, unknown or repeated segment "
                    f"{segment!r:.40} (expected 'host:IP,handshake:PORT,notify:PORT')",
                )
            parts[key] = value
        missing = [part for part in PARTS if part not in parts]
        if missing:
            raise ControlAddressError(
                missing[0], f"control address {text!r:.80} lacks {', '.join(missing)}"
            )
        return cls(parts["host"], _port(parts, "handshake"), _port(parts, "notify"))


def format_zmq_address(host: str, handshake_port: int, notify_port: int) -> str:
    """The wire form of the control address at ``host`` and the two ports."""
    return ControlAddress(host, handshake_port, notify_port).format()


def _port(parts: dict[str, str], part: str) -> int:
    text = parts[part]
    if not (text.isascii() and text.isdigit() and len(text) <= 5) or not 0 < int(text) <= MAX_PORT:
        raise ControlAddressError(
            part, f"control address {part} must be a port 1..{MAX_PORT}, got {text!r:.40}"
        )
    return int(text)
