"""Timeouts, retry/back-off policy and deadline queues: time as plain numbers, no clock."""
