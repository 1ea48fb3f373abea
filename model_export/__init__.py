"""ONNX export of trained DiSAN checkpoints into a verified serving bundle.

`model_export.export` builds the bundle (`disan export`), `model_export.verify` re-checks one
(`disan verify`), `model_export.graphs.wrappers` holds the thin export wrappers around `disan.model`.
"""
