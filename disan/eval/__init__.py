"""`disan eval`: a bundle scored on its tasks (`evaluate`), on STS beside students and baselines
(`sts_run`) and by frozen-vector transfer, SentEval style (`transfer`).

Owns: every number the model card reports. It sits on top of `disan`: it scores bundles (through
`disan.runtime`), students (`disan.distill`) and baselines (`disan.train.word_vectors`).
May import: everything in `disan`; nothing in `disan` imports it (`disan.cli` names it as a string).
"""
