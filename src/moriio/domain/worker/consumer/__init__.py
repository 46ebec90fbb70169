"""Decode-side worker halves: READ pulls the producer's blocks, WRITE awaits its pushes."""
