"""``moriio bench --soak``: a real P/D deployment kept under traffic, kills and cancels."""
