"""Scheduler-side books: which requests hold, load or release blocks, turned into orders."""
