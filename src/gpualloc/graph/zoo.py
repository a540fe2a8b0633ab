"""Built-in models in plain ``torch.nn``: ResNet-50, BERT-base, a GPT-2-style decoder, and tiny variants.

Each model is registered in :data:`ZOO` with a factory (no arguments), a function that builds example
inputs for a batch size, and a reference forward FLOP count per sample (multiply-add = 2) where one is
published or follows from a standard formula.

The architectures follow their references closely enough that parameter counts match exactly:

- ``resnet50``: torchvision's ResNet-50 (bottleneck v1.5, stride on the 3x3 conv), 25,557,032 params.
  He et al., "Deep Residual Learning for Image Recognition", CVPR 2016.
- ``bert-base``: BERT-base encoder with embeddings and pooler (HuggingFace ``BertModel`` layout),
  109,482,240 params. Devlin et al., "BERT: Pre-training of Deep Bidirectional Transformers", 2019.
- ``gpt2-small``: GPT-2 small (pre-LayerNorm decoder, tanh GELU, tied LM head), 124,439,808 params.
  Radford et al., "Language Models are Unsupervised Multitask Learners", 2019.

All forward passes are static in shape (no data-dependent control flow), create their own index
tensors on the input's device, and so trace with ``torch.export`` on the ``meta`` device.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gpualloc.errors import CaptureError

__all__ = [
    "ZOO",
    "BertConfig",
    "BertModel",
    "GPT",
    "GPTConfig",
    "ResNet",
    "ZooEntry",
    "get_model",
]


# ---------------------------------------------------------------------------------------------- ResNet
def _conv3x3(in_ch: int, out_ch: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(in_ch, out_ch, kernel_size=3, stride=stride, padding=1, bias=False)


def _conv1x1(in_ch: int, out_ch: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(in_ch, out_ch, kernel_size=1, stride=stride, bias=False)


class Bottleneck(nn.Module):
    """ResNet v1.5 bottleneck: 1x1 reduce, 3x3 (strided), 1x1 expand; one shared ReLU as in torchvision."""

    expansion = 4

    def __init__(self, in_ch: int, width: int, stride: int = 1, downsample: nn.Module | None = None) -> None:
        super().__init__()
        out_ch = width * self.expansion
        self.conv1 = _conv1x1(in_ch, width)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = _conv3x3(width, width, stride)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = _conv1x1(width, out_ch)
        self.bn3 = nn.BatchNorm2d(out_ch)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample

    def forward(self, x: Tensor) -> Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + identity)


class ResNet(nn.Module):
    """Bottleneck ResNet with torchvision's module names (``conv1``, ``layer1.0.conv1``, ``fc``, ...).

    Args:
        layers: bottleneck blocks per stage (ResNet-50: ``(3, 4, 6, 3)``).
        base_width: channels of the stem and of the first stage's bottlenecks (ResNet-50: 64).
        num_classes: classifier outputs.
    """

    def __init__(self, layers: tuple[int, ...] = (3, 4, 6, 3), base_width: int = 64, num_classes: int = 1000) -> None:
        super().__init__()
        self.in_ch = base_width
        self.conv1 = nn.Conv2d(3, base_width, kernel_size=7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(base_width)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        for i, blocks in enumerate(layers):
            stage = self._make_stage(base_width * 2**i, blocks, stride=1 if i == 0 else 2)
            setattr(self, f"layer{i + 1}", stage)
        self.num_stages = len(layers)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(self.in_ch, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def _make_stage(self, width: int, blocks: int, stride: int) -> nn.Sequential:
        out_ch = width * Bottleneck.expansion
        downsample = None
        if stride != 1 or self.in_ch != out_ch:
            downsample = nn.Sequential(_conv1x1(self.in_ch, out_ch, stride), nn.BatchNorm2d(out_ch))
        stage = [Bottleneck(self.in_ch, width, stride, downsample)]
        self.in_ch = out_ch
        stage += [Bottleneck(out_ch, width) for _ in range(1, blocks)]
        return nn.Sequential(*stage)

    def forward(self, x: Tensor) -> Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        for i in range(self.num_stages):
            x = getattr(self, f"layer{i + 1}")(x)
        return self.fc(torch.flatten(self.avgpool(x), 1))


# ---------------------------------------------------------------------------------------------- BERT
@dataclass(frozen=True)
class BertConfig:
    """BERT encoder hyper-parameters.

    Attributes:
        vocab_size: word-piece vocabulary.
        hidden: model width.
        layers: encoder layers.
        heads: attention heads (``hidden`` must divide evenly).
        ffn: feed-forward inner width.
        max_positions: learned position embeddings.
        seq_len: sequence length of the example inputs.
    """

    vocab_size: int = 30522
    hidden: int = 768
    layers: int = 12
    heads: int = 12
    ffn: int = 3072
    max_positions: int = 512
    seq_len: int = 128
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12


class BertEmbeddings(nn.Module):
    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(cfg.vocab_size, cfg.hidden)
        self.position_embeddings = nn.Embedding(cfg.max_positions, cfg.hidden)
        self.token_type_embeddings = nn.Embedding(cfg.type_vocab_size, cfg.hidden)
        self.LayerNorm = nn.LayerNorm(cfg.hidden, eps=cfg.layer_norm_eps)
        self.dropout = nn.Dropout(0.1)

    def forward(self, input_ids: Tensor) -> Tensor:
        seq = input_ids.shape[1]
        positions = torch.arange(seq, device=input_ids.device).unsqueeze(0)
        token_types = torch.zeros_like(input_ids)
        x = self.word_embeddings(input_ids) + self.position_embeddings(positions)
        x = x + self.token_type_embeddings(token_types)
        return self.dropout(self.LayerNorm(x))


class BertSelfAttention(nn.Module):
    """Multi-head attention written out (matmul, scale, softmax, matmul) as in the reference code."""

    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.heads = cfg.heads
        self.head_dim = cfg.hidden // cfg.heads
        self.query = nn.Linear(cfg.hidden, cfg.hidden)
        self.key = nn.Linear(cfg.hidden, cfg.hidden)
        self.value = nn.Linear(cfg.hidden, cfg.hidden)
        self.dropout = nn.Dropout(0.1)

    def _split(self, x: Tensor) -> Tensor:
        b, s, _ = x.shape
        return x.view(b, s, self.heads, self.head_dim).transpose(1, 2)

    def forward(self, x: Tensor) -> Tensor:
        q, k, v = self._split(self.query(x)), self._split(self.key(x)), self._split(self.value(x))
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.head_dim)
        probs = self.dropout(scores.softmax(dim=-1))
        ctx = torch.matmul(probs, v).transpose(1, 2)
        return ctx.reshape(x.shape)


class BertLayer(nn.Module):
    """Post-LayerNorm encoder layer: attention, add & norm, GELU FFN, add & norm."""

    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.attention = BertSelfAttention(cfg)
        self.attention_output = nn.Linear(cfg.hidden, cfg.hidden)
        self.attention_norm = nn.LayerNorm(cfg.hidden, eps=cfg.layer_norm_eps)
        self.intermediate = nn.Linear(cfg.hidden, cfg.ffn)
        self.output = nn.Linear(cfg.ffn, cfg.hidden)
        self.output_norm = nn.LayerNorm(cfg.hidden, eps=cfg.layer_norm_eps)
        self.dropout = nn.Dropout(0.1)

    def forward(self, x: Tensor) -> Tensor:
        x = self.attention_norm(x + self.dropout(self.attention_output(self.attention(x))))
        h = F.gelu(self.intermediate(x))
        return self.output_norm(x + self.dropout(self.output(h)))


class BertEncoder(nn.Module):
    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.layer = nn.ModuleList(BertLayer(cfg) for _ in range(cfg.layers))

    def forward(self, x: Tensor) -> Tensor:
        for layer in self.layer:
            x = layer(x)
        return x


class BertPooler(nn.Module):
    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(cfg.hidden, cfg.hidden)

    def forward(self, x: Tensor) -> Tensor:
        return torch.tanh(self.dense(x[:, 0]))


class BertModel(nn.Module):
    """BERT encoder: embeddings, ``layers`` encoder layers, pooler. Returns (sequence, pooled)."""

    def __init__(self, cfg: BertConfig = BertConfig()) -> None:
        super().__init__()
        self.config = cfg
        self.embeddings = BertEmbeddings(cfg)
        self.encoder = BertEncoder(cfg)
        self.pooler = BertPooler(cfg)

    def forward(self, input_ids: Tensor) -> tuple[Tensor, Tensor]:
        seq = self.encoder(self.embeddings(input_ids))
        return seq, self.pooler(seq)


# ---------------------------------------------------------------------------------------------- GPT
@dataclass(frozen=True)
class GPTConfig:
    """GPT-2-style decoder hyper-parameters.

    Attributes:
        vocab_size: BPE vocabulary.
        seq_len: context length (learned positions) and the example inputs' length.
        d_model: model width.
        layers: decoder blocks.
        heads: attention heads (``d_model`` must divide evenly).
    """

    vocab_size: int = 50257
    seq_len: int = 1024
    d_model: int = 768
    layers: int = 12
    heads: int = 12


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.heads = cfg.heads
        self.c_attn = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.c_proj = nn.Linear(cfg.d_model, cfg.d_model)

    def forward(self, x: Tensor) -> Tensor:
        b, t, d = x.shape
        q, k, v = self.c_attn(x).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).reshape(b, t, d))


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.c_fc = nn.Linear(cfg.d_model, 4 * cfg.d_model)
        self.c_proj = nn.Linear(4 * cfg.d_model, cfg.d_model)

    def forward(self, x: Tensor) -> Tensor:
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class Block(nn.Module):
    """Pre-LayerNorm decoder block."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.d_model)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.d_model)
        self.mlp = MLP(cfg)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """GPT-2-style language model (``wte``, ``wpe``, ``h.N``, ``ln_f``, tied ``lm_head``). Returns logits."""

    def __init__(self, cfg: GPTConfig = GPTConfig()) -> None:
        super().__init__()
        self.config = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.wpe = nn.Embedding(cfg.seq_len, cfg.d_model)
        self.h = nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # weight tying, as in GPT-2

    def forward(self, idx: Tensor) -> Tensor:
        positions = torch.arange(idx.shape[1], device=idx.device)
        x = self.wte(idx) + self.wpe(positions)
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))


# ---------------------------------------------------------------------------------------------- registry
@dataclass(frozen=True)
class ZooEntry:
    """A built-in model.

    Attributes:
        factory: builds the model (random weights, train mode as built by ``nn.Module``).
        example_inputs: ``batch -> tuple of input tensors`` for one forward pass.
        description: one line for listings.
        flops_per_sample: reference forward FLOPs per sample (multiply-add = 2), or None.
        flops_source: where ``flops_per_sample`` comes from.
    """

    factory: Callable[[], nn.Module]
    example_inputs: Callable[[int], tuple[Tensor, ...]]
    description: str
    flops_per_sample: float | None = None
    flops_source: str | None = None


def _images(size: int) -> Callable[[int], tuple[Tensor, ...]]:
    def make(batch: int) -> tuple[Tensor, ...]:
        return (torch.randn(batch, 3, size, size),)

    return make


def _tokens(vocab_size: int, seq_len: int) -> Callable[[int], tuple[Tensor, ...]]:
    def make(batch: int) -> tuple[Tensor, ...]:
        return (torch.randint(0, vocab_size, (batch, seq_len), dtype=torch.int64),)

    return make


def _transformer_flops(n_matmul_params: int, layers: int, seq: int, d: int) -> float:
    """Forward FLOPs per sequence: 2 per weight per token, plus QK^T and AV (4 seq^2 d per layer).

    Kaplan et al., "Scaling Laws for Neural Language Models", 2020, Table 1 (with both attention
    matmuls counted over the full, unmasked score matrix, as dense kernels compute them).
    """
    return 2.0 * n_matmul_params * seq + 4.0 * layers * seq * seq * d


_BERT_BASE = BertConfig()
_BERT_TINY = BertConfig(vocab_size=1000, hidden=64, layers=2, heads=2, ffn=256, max_positions=64, seq_len=32)
_GPT2_SMALL = GPTConfig()
_GPT_TINY = GPTConfig(vocab_size=1000, seq_len=64, d_model=64, layers=2, heads=4)


def _bert(cfg: BertConfig, description: str, flops_source: str) -> ZooEntry:
    """A BERT entry: token inputs of ``cfg``'s vocabulary and sequence length, FLOPs from its sizes."""
    per_layer = 4 * cfg.hidden**2 + 2 * cfg.hidden * cfg.ffn
    flops = _transformer_flops(cfg.layers * per_layer, cfg.layers, cfg.seq_len, cfg.hidden)
    return ZooEntry(factory=lambda: BertModel(cfg), example_inputs=_tokens(cfg.vocab_size, cfg.seq_len),
                    description=description, flops_per_sample=flops, flops_source=flops_source)


def _gpt(cfg: GPTConfig, description: str, flops_source: str) -> ZooEntry:
    """A GPT entry: token inputs of ``cfg``'s vocabulary and sequence length, FLOPs from its sizes."""
    per_layer = 12 * cfg.d_model**2
    lm_head = cfg.d_model * cfg.vocab_size  # the output projection is a matmul; the embedding lookup is not
    flops = _transformer_flops(cfg.layers * per_layer + lm_head, cfg.layers, cfg.seq_len, cfg.d_model)
    return ZooEntry(factory=lambda: GPT(cfg), example_inputs=_tokens(cfg.vocab_size, cfg.seq_len),
                    description=description, flops_per_sample=flops, flops_source=flops_source)


ZOO: dict[str, ZooEntry] = {
    "resnet50": ZooEntry(
        factory=lambda: ResNet((3, 4, 6, 3), 64, 1000),
        example_inputs=_images(224),
        description="ResNet-50 v1.5 (torchvision layout), 1000 classes, 3x224x224 images",
        flops_per_sample=8.18e9,
        flops_source="torchvision model card: 4.09 GMACs at 224x224 (x2 for FLOPs)",
    ),
    "bert-base": _bert(
        _BERT_BASE, "BERT-base encoder (12 x 768, 12 heads, FFN 3072) with embeddings and pooler, seq 128",
        "2 x encoder weights x tokens + attention matmuls (Kaplan et al. 2020); ~22.4 GFLOP"),
    "gpt2-small": _gpt(
        _GPT2_SMALL, "GPT-2 small decoder (12 x 768, 12 heads, vocab 50257, tied LM head), seq 1024",
        "2 x (block weights + LM head) x tokens + attention matmuls (Kaplan et al. 2020); ~292 GFLOP"),
    "resnet-tiny": ZooEntry(
        factory=lambda: ResNet((1, 1, 1, 1), 8, 10),
        example_inputs=_images(64),
        description="tiny bottleneck ResNet for tests (1 block per stage, width 8, 10 classes, 3x64x64)",
    ),
    "bert-tiny": _bert(_BERT_TINY, "tiny BERT for tests (2 x 64, 2 heads, FFN 256, vocab 1000, seq 32)",
                       "same formula as bert-base"),
    "gpt-tiny": _gpt(_GPT_TINY, "tiny GPT for tests (2 x 64, 4 heads, vocab 1000, seq 64)",
                     "same formula as gpt2-small"),
}


def get_model(name: str) -> ZooEntry:
    """The zoo entry called ``name``; raises CaptureError naming the known models otherwise."""
    try:
        return ZOO[name]
    except KeyError:
        raise CaptureError(f"unknown zoo model {name!r}; known: {', '.join(sorted(ZOO))}") from None
