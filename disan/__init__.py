"""DiSAN: Directional Self-Attention Network sentence encoders (Shen et al., AAAI 2018).

Torch-free modules (`disan.text`, `disan.manifest`) are imported by the service; everything
that needs torch (`disan.model`, `disan.train`, ...) is imported only by training and export.
`disan.Encoder` (disan.encoder, on onnxruntime) is the Python API: text in, vectors out.
"""

__version__ = "0.1.0"


def __getattr__(name: str):
    """`from disan import Encoder` without importing onnxruntime for `import disan` itself."""
    if name == "Encoder":
        from disan.encoder import Encoder  # lazy: onnxruntime is optional (the serve/embed extras)

        return Encoder
    raise AttributeError(f"module 'disan' has no attribute {name!r}")
