"""Connector settings: parsed from vLLM's extra config and the environment, validated once."""
