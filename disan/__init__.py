"""DiSAN: Directional Self-Attention Network sentence encoders (Shen et al., AAAI 2018).

Torch-free modules (`disan.text`, `disan.manifest`) are imported by the service; everything
that needs torch (`disan.model`, `disan.train`, ...) is imported only by training and export.
"""

__version__ = "0.1.0"
