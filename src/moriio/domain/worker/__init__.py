"""Worker-side services: producer and consumer halves, the poster, peers and progress."""
