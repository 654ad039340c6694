"""The classifier's model: model.py's Transformer without the causal mask, a padding mask, the
mean over real tokens and a class head, fastText's bag of words beside it where bow_head is set;
its config, EncoderConfig, is model.py's. Imported only for a classifier."""

import torch
import torch.nn as nn
import torch.nn.functional as F

from model import Transformer, varying_lengths


class EncoderClassifier(Transformer):
    """The same Blocks without the causal mask, a padding mask, mean pooling over real tokens and
    a class head."""

    # bow_head's learning rate, a multiple of train.py's (peak 0.2 for config/agnews.py)
    BOW_LR_SCALE = 200
    OWN_MODULES = ("head", "bow")

    def __init__(self, config):
        super().__init__(config, causal=False)
        self.head = nn.Linear(config.n_embd, config.n_classes)
        self.bow = None
        if config.bow_head:
            # a row per token, then bow_buckets rows of hashed bigrams
            self.bow = nn.Embedding(config.vocab_size + config.bow_buckets, config.n_classes)
        self.init_weights()

    def optimizer_groups(self):
        """bow's table learns at fastText's far higher rate, without decay."""
        if self.bow is None:
            return []
        return [{"params": [self.bow.weight], "weight_decay": 0.0, "lr_scale": self.BOW_LR_SCALE}]

    def bow_logits(self, idx, real):
        """fastText's linear classifier [B, n_classes]: a row per real token (and hashed bigram),
        summed over the square root of their count."""
        features = idx
        real = real.float()
        if self.config.bow_buckets:
            previous = F.pad(idx[:, :-1], (1, 0), value=self.config.pad_token_id)
            hashed = (previous * 1_000_003 + idx) % self.config.bow_buckets
            bigrams = self.config.vocab_size + hashed
            features = torch.cat([idx, bigrams], 1)
            real = real.repeat(1, 2)
        summed = (self.bow(features).float() * real.unsqueeze(-1)).sum(1)
        count = real.sum(1, keepdim=True).clamp(min=1)
        return summed / count.sqrt()

    def forward(self, idx, attention_mask=None, labels=None, need_weights=False):
        """idx [B, n], attention_mask [B, n] (1 = real token; default idx != pad_token_id) ->
        (logits [B, n_classes], loss or None[, maps])."""
        if attention_mask is None:
            real = idx != self.config.pad_token_id
        else:
            real = attention_mask.bool()
        # hidden tokens read as padding: a shorter text
        if self.training and self.config.token_dropout > 0:
            kept = real & (torch.rand(real.shape, device=real.device) >= self.config.token_dropout)
            # a row left with no key would attend to nothing (NaN in some GPU kernels):
            # such rows keep their tokens
            real = torch.where(kept.any(1, keepdim=True), kept, real)
        # padded lengths change from batch to batch: no cuDNN attention
        with varying_lengths():
            # padding keys hidden
            x, maps = self.hidden_states(idx, real[:, None, None, :], need_weights=need_weights)
        weights = real.unsqueeze(-1).to(x.dtype)
        # mean over real tokens, not a CLS token: every token gets a gradient
        mean = (x * weights).sum(1) / weights.sum(1).clamp(min=1)  # (B, d)
        logits = self.head(mean).float()  # (B, n_classes)
        loss = None if labels is None else F.cross_entropy(logits, labels)
        if self.bow is not None:
            # an ensemble: each classifier trained by its own loss; the mean of their
            # log-probabilities (the normalised geometric mean of their probabilities) has the
            # product's argmax without its overconfidence
            bow = self.bow_logits(idx, real)
            if labels is not None:
                loss = (loss + F.cross_entropy(bow, labels)) / 2
            logits = (F.log_softmax(logits, -1) + F.log_softmax(bow, -1)) / 2
        return (logits, loss, maps) if need_weights else (logits, loss)
