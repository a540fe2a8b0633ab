"""BERT encoders of a few layers, for ``gpualloc graph capture benchmarks.bert_layers:FACTORY``.

The zoo's :class:`~gpualloc.graph.zoo.BertModel` with fewer layers: ``bert3`` / ``bert6`` at BERT-base
width (768, 12 heads, FFN 3072), ``bert3_small`` / ``bert6_small`` at 256 (4 heads, FFN 1024, the width
of the compact BERTs of Turc et al., "Well-Read Students Learn Better", 2019). Sequence 128. Used by
``benchmarks/launch_bert.py`` (issue 34: the per-op launch term on graphs of small operators).
"""

from __future__ import annotations

import torch

from gpualloc.graph.zoo import BertConfig, BertModel

SEQ_LEN = 128
VOCAB = 30522


def _bert(layers: int, hidden: int = 768) -> BertModel:
    return BertModel(BertConfig(vocab_size=VOCAB, hidden=hidden, layers=layers, heads=hidden // 64,
                                ffn=4 * hidden, seq_len=SEQ_LEN))


def bert3() -> BertModel:
    """3 encoder layers at BERT-base width."""
    return _bert(3)


def bert6() -> BertModel:
    """6 encoder layers at BERT-base width."""
    return _bert(6)


def bert3_small() -> BertModel:
    """3 encoder layers of width 256."""
    return _bert(3, 256)


def bert6_small() -> BertModel:
    """6 encoder layers of width 256."""
    return _bert(6, 256)


def example_inputs(batch: int) -> tuple[torch.Tensor, ...]:
    """Token ids of ``batch`` sequences of ``SEQ_LEN`` (seeded: the same graph every capture)."""
    gen = torch.Generator().manual_seed(0)
    return (torch.randint(0, VOCAB, (batch, SEQ_LEN), dtype=torch.int64, generator=gen),)
