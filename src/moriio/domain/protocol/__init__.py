"""What peers say to each other: control messages and their msgpack codec, the handshake,
the fingerprint it compares, and the announcements engines send their router."""
