"""Text in, ids out (TORCH-FREE): the tokenizer and `Vocab` (`tokenizer`), long texts cut into
windows of the model's `max_len` and pooled back (`windowing`), and the one preparation of texts
for a graph that `disan.Encoder` and the service share (`prepare`: fit, window, truncate or
refuse; rows; pooled results).

Owns: everything that turns a string into token ids, shared by training, export, serving and eval.
May import: nothing of this repository but `disan.optional` (it is the bottom layer; `disan.model`
reads its UNK id).
"""
