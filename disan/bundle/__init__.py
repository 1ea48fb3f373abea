"""The bundle contract (TORCH-FREE): `manifest` (graph names and their I/O, labels, routes,
the tokenizer each graph reads, the manifest read and written, route fingerprints), `lineage`
(the checkpoints a bundle came from) and `dimensions` (how a shorter vector is made).

Owns: what a bundle directory is; the export writes it, the runtime and the service read it.
May import: `disan.text` and `disan.optional` (no torch here).
"""
