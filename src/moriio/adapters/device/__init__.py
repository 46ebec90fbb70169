"""Device memory adapters (torch and the CUDA/HIP driver): fences and thread binding on the
accelerator's streams, per-layer gates a stream waits on, IPC mapping of a same-host peer's
memory, and the kernels and engine that copy KV between mapped memories.

Importing this package imports nothing; each module imports torch (or the driver) itself.
"""
