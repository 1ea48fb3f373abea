"""The task teacher's classifier (`disan task-teacher`): a sentence-transformer's transformer and
mean pooling with a linear head, and its logits of a list of texts."""

from __future__ import annotations

import numpy as np

from disan.distill.teacher import bf16_autocast


class Classifier:
    """A sentence-transformer's transformer and pooling, and a linear head on the pooled vector."""

    def __init__(self, source: str, num_classes: int, device: str = "cpu", max_seq_length: int = 128):
        import torch  # optional (`train` extra): the module loads without it

        from disan.train.word_vectors import (
            _sentence_encoder,  # imports sentence-transformers (the mpnet extra)
        )

        st = _sentence_encoder(source, device)
        st.max_seq_length = max_seq_length
        self.body = torch.nn.Sequential(st[0], st[1])  # transformer, mean pooling (no normalisation)
        dim = st[0].auto_model.config.hidden_size  # mean pooling keeps the transformer's width
        self.head = torch.nn.Linear(dim, num_classes).to(device)
        self.tokenizer = st.tokenizer
        self.max_seq_length = max_seq_length
        self.device = device

    def parameters(self):
        return [*self.body.parameters(), *self.head.parameters()]

    def train(self, on: bool) -> None:
        self.body.train(on)
        self.head.train(on)

    def logits(self, texts: list[str]):
        feats = self.tokenizer(texts, padding=True, truncation=True, max_length=self.max_seq_length,
                               return_tensors="pt")
        feats = {k: v.to(self.device) for k, v in feats.items()}
        pooled = self.body(feats)["sentence_embedding"]
        return self.head(pooled.float())

    def state_dict(self) -> dict:
        return {"body": self.body.state_dict(), "head": self.head.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.body.load_state_dict(state["body"])
        self.head.load_state_dict(state["head"])


def predict(model: Classifier, texts: list[str], batch_size: int, precision: str) -> np.ndarray:
    """Logits [N, C] (float32), batches of similar length for speed, in `texts` order."""
    import torch  # optional (`train` extra)

    model.train(False)
    order = np.argsort([len(t) for t in texts], kind="stable")
    out = np.zeros((len(texts), model.head.out_features), dtype=np.float32)
    with torch.inference_mode(), bf16_autocast(model.device, precision):
        for i in range(0, len(order), batch_size):
            idx = order[i:i + batch_size]
            out[idx] = model.logits([texts[j] for j in idx]).float().cpu().numpy()
    return out


def accuracy(logits: np.ndarray, labels: list[int]) -> float:
    return float((logits.argmax(-1) == np.asarray(labels)).mean())
