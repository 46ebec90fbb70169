"""Decode-side scheduler book: loads to order and their outcome, in either mode."""
