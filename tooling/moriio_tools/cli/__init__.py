"""The tooling commands behind ``moriio demo`` and ``moriio bench``."""
