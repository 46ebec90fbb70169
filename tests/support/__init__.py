"""Shared test support code (harnesses, builders)."""
