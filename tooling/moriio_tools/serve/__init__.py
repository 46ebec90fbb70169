"""The `vllm serve` deployment: tokenizer, router, engine processes, HTTP client, demo phases."""
