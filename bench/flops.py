"""Model FLOPs of a training step, counted from the architecture (matrix products only, a
multiply-add = 2 FLOPs, backward = 2x forward). The same count is used for both sides: it is
the work the task needs (vocabulary logits only where a token is scored), not the work an
implementation happens to do, so MFU compares like with like."""
from __future__ import annotations


def _layer(tokens: int, keys: int, c: int, f: int) -> int:
    """One post-norm BERT block over `tokens` queries attending to `keys` keys (forward)."""
    return tokens * (8 * c * c + 4 * c * f + 4 * keys * c)


def mlm_step(batch: int, seq: int, scored: int, c: int, f: int, layers: int, vocab: int) -> int:
    fwd = layers * _layer(batch * seq, seq, c, f)
    fwd += scored * (2 * c * c + 2 * c * vocab)  # MLM head on the masked positions only
    return 3 * fwd


def seq2seq_step(batch: int, src: int, tgt: int, scored: int, c: int, f: int, enc_layers: int, dec_layers: int,
                 vocab: int) -> int:
    """`src`/`tgt`: padded lengths (every position is computed); `scored`: non-pad labels."""
    fwd = enc_layers * _layer(batch * src, src, c, f)
    per_dec = _layer(batch * tgt, tgt, c, f)  # causal self-attention + FFN
    per_dec += batch * tgt * (4 * c * c + 4 * src * c)  # cross-attention queries/outputs + scores/values
    per_dec += batch * src * 4 * c * c  # cross-attention keys/values of the source
    fwd += dec_layers * per_dec
    fwd += scored * (2 * c * c + 2 * c * vocab)  # LM head where a label is scored
    return 3 * fwd
