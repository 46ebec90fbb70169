"""``moriio router``: a P/D router that engines announce themselves to."""
