"""Small values both boundaries share: control addresses, host lists, transfer modes and
capability tokens."""
