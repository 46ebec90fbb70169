"""Prefill-side worker halves: READ holds blocks for consumers to read, WRITE pushes them."""
