"""The model side: a bundle's runtime and one micro-batcher per graph, run in each worker
(model.py, batcher.py). Knows nothing of HTTP or of the engine above it."""
