"""`disan eval`: a bundle scored on its tasks (`evaluate`), on STS beside students and baselines
(`sts_run`), by frozen-vector transfer, SentEval style (`transfer`), and on retrieval sets in BEIR's
layout (`retrieval`: nDCG@10, MRR@10, recall@100 through pytrec_eval).

Owns: every number the model card reports. It sits on top of `disan`: it scores bundles (through
`disan.runtime`), students (`disan.distill`) and baselines (`disan.train.word_vectors`).
May import: everything in `disan`; nothing in `disan` imports it (`disan.cli` names it as a string).
"""
