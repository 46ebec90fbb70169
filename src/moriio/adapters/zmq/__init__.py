"""ZMQ control plane: :class:`ZmqControlChannel` implements the ControlChannel port."""

from moriio.adapters.zmq.channel import ZmqControlChannel
from moriio.adapters.zmq.framing import FrameLimits, Reason
from moriio.adapters.zmq.trust import TrustList

__all__ = ["FrameLimits", "Reason", "TrustList", "ZmqControlChannel"]
