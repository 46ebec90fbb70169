"""NIXL (UCX) transfer engine: CPU and NVIDIA GPU memory, loopback or network."""

from moriio.adapters.nixl.engine import NixlTransferEngine

__all__ = ["NixlTransferEngine"]
