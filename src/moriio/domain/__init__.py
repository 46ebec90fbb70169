"""The pure core of moriio: layout, planning, ledgers, policy and wire messages."""
