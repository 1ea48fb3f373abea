"""The model side: a bundle's runtime and one micro-batcher per graph, run in the worker
(model.py, batcher.py) or in the shared inference process the workers feed over a Unix socket
(inference_process.py, remote.py, wire.py). Knows nothing of HTTP or of the engine above it."""
