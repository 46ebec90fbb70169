"""The `moriio` command line."""
