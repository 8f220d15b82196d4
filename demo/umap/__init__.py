"""UMAP in a process of its own, so that its seconds of CPU never hold the server's interpreter lock.

- `service`: the server's side: paced while a run trains, held stopped while no page asks.
- `child`: the process's side: ends with the server, compiles once, lays out what it is sent.
- `worker`: `UmapWorker`, the thread that queues the all-classes pictures, newest first, each aligned to the last.
"""
