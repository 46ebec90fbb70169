"""Prefill-side scheduler books: hand-offs, leases and releases (READ), push orders (WRITE)."""
