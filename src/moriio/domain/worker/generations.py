"""Registration generations: which memory of a peer instance a transfer's blocks lie in.

A worker registers its KV memory at start (generation 1) and again after every wake from
sleep mode (one more each time, maybe at other addresses); before it sleeps it tells the
peers that hold its regions which generation it retires (see
:mod:`moriio.domain.worker.sleep`). A transfer names the generation of its blocks
(``remote_registration_generation`` in ``kv_transfer_params``, ``consumer_generation`` in a
WRITE announcement): a connection to another generation never serves it.
"""

from __future__ import annotations

from collections import OrderedDict

from moriio.domain.worker.peer_checks import ConnectedPeer, PeerGenerationError
from moriio.ports import PeerAddress


def serves_generation(address: PeerAddress, peer: ConnectedPeer, generation: int | None) -> bool:
    """Whether the connection ``peer`` serves ``generation``: False when it is older (a
    handshake must fetch the new regions). Raises :class:`PeerGenerationError` when the
    transfer's generation is older than the peer's (its memory was released), or names none
    while the peer registered again."""
    if generation is None:
        if peer.generation > 1:
            raise PeerGenerationError(
                f"peer {address} registered its KV cache again (generation {peer.generation})"
                " and the transfer does not name the generation of its blocks"
                " (kv_transfer_params lack remote_registration_generation)"
            )
        return True
    if generation > peer.generation:
        return False
    if generation < peer.generation:
        raise PeerGenerationError(
            f"peer {address} retired registration generation {generation} (it slept; its "
            f"KV memory was released) and serves generation {peer.generation} now"
        )
    return True


class RetiredGenerations:
    """The last generation each peer instance told us it retired (bounded, oldest out)."""

    def __init__(self, capacity: int) -> None:
        self._capacity = capacity
        self._retired: OrderedDict[str, int] = OrderedDict()
        self._keys: dict[str, bytes] = {}  # the instance's hand-off key, where we had it

    def add(self, instance_id: str, generation: int, handoff_key: bytes = b"") -> None:
        if handoff_key:
            self._keys[instance_id] = handoff_key
        if self._retired.get(instance_id, 0) < generation:
            self._retired[instance_id] = generation
            self._retired.move_to_end(instance_id)
            if len(self._retired) > self._capacity:
                oldest, _ = self._retired.popitem(last=False)
                self._keys.pop(oldest, None)

    def handoff_key(self, instance_id: str) -> bytes:
        """The hand-off key ``instance_id`` signed with before it retired (empty: unknown):
        its earlier hand-offs are still checked before a refused request frees them."""
        return self._keys.get(instance_id, b"") if instance_id in self._retired else b""

    def covers(self, instance_id: str, generation: int) -> bool:
        """Whether ``generation`` of ``instance_id`` is retired."""
        return self._retired.get(instance_id, 0) >= generation

    def check(self, address: PeerAddress, instance_id: str | None, generation: int | None) -> None:
        """Refuse a transfer whose generation its peer told us it retired."""
        retired = None if instance_id is None else self._retired.get(instance_id)
        if retired is not None and (generation is None or generation <= retired):
            raise PeerGenerationError(
                f"peer {address} retired registration generation {retired} of instance "
                f"{instance_id!r} (it slept; its KV memory was released); the transfer names "
                f"generation {generation}"
            )
