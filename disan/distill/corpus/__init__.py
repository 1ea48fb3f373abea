"""The distillation corpus (`disan distill corpus`, torch-free): `build` (sentences, passages,
queries and pairs, deduplicated, no evaluation text), `sources` (where the text comes from, with its
licence), `documents` (titled documents and the HTML, POD and man page parsers), `nltk` (readers of
NLTK's corpora).

Owns: the corpus folder's format (`sentences.txt`, `kinds.npy`, `pairs.npy`, `corpus.json`).
May import: disan.text, disan.data, disan.optional.
"""
