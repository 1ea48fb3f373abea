"""The teacher's space with its directions evened out (`disan pretrain --corpus --whitened W`).

A teacher's sentence vectors spend most of their variance in a few principal directions, and a
cosine loss to them teaches those first. The rest carry less variance but not less information:
a linear probe on standardised features (the transfer tasks) reads them as much as the top
ones. This map scales the teacher's principal coordinates by singular value^-power (power 1:
full whitening; 0.5: half way), so a cosine in the mapped space weighs those directions more.
Fitted once on a seeded sample of the teacher cache; used only in training.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

FIT_ROWS = 50_000  # enough rows for a stable 768 x 768 covariance; the SVD takes seconds


def principal_axes(teacher: np.ndarray, rows: int = FIT_ROWS, seed: int = 0):
    """The mean, singular values and principal directions ([k, D], loudest first) of a seeded
    sample of at most `rows` of the teacher's vectors, each normalised to length 1."""
    pick = np.sort(np.random.default_rng(seed).choice(len(teacher), min(rows, len(teacher)), replace=False))
    x = np.asarray(teacher[pick], dtype=np.float64)
    x /= np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
    mean = x.mean(axis=0)
    _, singular, basis = np.linalg.svd(x - mean, full_matrices=False)
    return mean, singular, basis


class TeacherWhitening:
    """x -> ((normalize(x) - mean) @ basis.T) * scale: the teacher's principal coordinates,
    each scaled by its singular value^-power (normalised so the mean scale is 1)."""

    def __init__(self, mean: torch.Tensor, basis: torch.Tensor, scale: torch.Tensor):
        self.mean, self.basis, self.scale = mean, basis, scale  # [D], [D,D], [D]

    @classmethod
    def fit(cls, teacher: np.ndarray, power: float, rows: int = FIT_ROWS, seed: int = 0) -> TeacherWhitening:
        """From the teacher's vectors (a seeded sample of at most `rows`)."""
        if not 0.0 < power <= 1.0:
            raise ValueError(f"whitening power must be in (0, 1], got {power}")
        mean, singular, basis = principal_axes(teacher, rows, seed)
        # Directions with (numerically) no variance would be blown up to noise: floor them.
        scale = np.maximum(singular, singular[0] * 1e-3) ** -power
        scale /= scale.mean()
        as_t = lambda a: torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32))  # noqa: E731
        return cls(as_t(mean), as_t(basis), as_t(scale))

    def to(self, device) -> TeacherWhitening:
        return TeacherWhitening(self.mean.to(device), self.basis.to(device), self.scale.to(device))

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return ((F.normalize(x, dim=-1) - self.mean) @ self.basis.T) * self.scale  # [B,k]

    def loss(self, pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """1 - cosine of the student's and the teacher's vectors in the evened-out space."""
        return 1.0 - F.cosine_similarity(self(pred), self(target), dim=-1).mean()
