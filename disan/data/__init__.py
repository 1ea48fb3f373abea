"""Data sets (TORCH-FREE): `readers` (SNLI / MultiNLI / SICK / SST / text-label files, label
mapping, token-id encoding), `recipes` (the staged-data layout and the paper's per-task defaults)
and `sts` (STS-B / SICK pairs and the cosine Spearman score).

Owns: where the staged data lives and how it is read; training, distillation, eval and the
export's agreement check all read it from here.
May import: `disan.text`, `disan.bundle`, `disan.optional` (beside `disan.embed`: neither imports
the other).
"""
