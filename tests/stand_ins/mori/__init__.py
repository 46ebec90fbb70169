"""Stand-in for AMD's ``mori`` package (only ``mori.io`` and ``mori.cpp``), for tests."""

__version__ = "0.0.0+stand-in"
STAND_IN = True
