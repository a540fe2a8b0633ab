"""The training loss the engine runs for a model, per sample, so that any split of the batch sums back exactly.

A :class:`Loss` gives the targets of a batch (from its inputs, or seeded labels) and the per-sample loss of an
output. A rank's loss is the sum of its samples' losses over the *global* batch, times ``dp`` (see
:func:`gpualloc.execute.engine.topology.loss_scale`); the unsplit model's loss, the reference, is the mean over
the global batch.

* GPT-style language models (:class:`gpualloc.graph.zoo.GPT`): next-token cross-entropy, each sequence's mean
  over its ``T - 1`` predicted tokens.
* ResNet: cross-entropy of the logits against seeded class labels.
* BERT (:class:`gpualloc.graph.zoo.BertModel`, no task head): cross-entropy of the pooled output read as
  ``hidden``-way logits against seeded labels (a classification-style head-less loss).
* Any other model: the mean of every floating-point output (the queue runner's loss); its targets are unused.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gpualloc.errors import EngineError

__all__ = ["Loss", "loss_for"]


@dataclass(frozen=True)
class Loss:
    """A per-sample loss.

    Attributes:
        name: what it is, in a few words (written to the run record).
        targets: ``(inputs, seed) -> tensor`` of the batch's targets (first dimension the batch).
        per_sample: ``(outputs, targets) -> tensor [batch]`` of each sample's loss; ``outputs`` is the model's
            flat output tuple.
    """

    name: str
    targets: Callable[[Sequence[Tensor], int], Tensor]
    per_sample: Callable[[tuple[Tensor, ...], Tensor], Tensor]


def _next_token_targets(inputs: Sequence[Tensor], seed: int) -> Tensor:
    return inputs[0][:, 1:].contiguous()


def _next_token(outputs: tuple[Tensor, ...], targets: Tensor) -> Tensor:
    logits = outputs[0][:, :-1]
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction="none")
    return loss.view(targets.shape).mean(dim=1)


def _labels(classes: int) -> Callable[[Sequence[Tensor], int], Tensor]:
    def _make(inputs: Sequence[Tensor], seed: int) -> Tensor:  # the engine's seed, checked where it is read
        gen = torch.Generator().manual_seed(seed)
        return torch.randint(0, classes, (int(inputs[0].shape[0]),), generator=gen)

    return _make


def _classify(index: int) -> Callable[[tuple[Tensor, ...], Tensor], Tensor]:
    def loss(outputs: tuple[Tensor, ...], targets: Tensor) -> Tensor:
        return F.cross_entropy(outputs[index], targets, reduction="none")

    return loss


def _no_targets(inputs: Sequence[Tensor], seed: int) -> Tensor:
    return torch.zeros(int(inputs[0].shape[0]))


def _mean_outputs(outputs: tuple[Tensor, ...], targets: Tensor) -> Tensor:
    floats = [t for t in outputs if isinstance(t, Tensor) and t.is_floating_point()]
    if not floats:
        raise EngineError("the model has no floating-point output to train on")
    return sum(t.reshape(t.shape[0], -1).mean(dim=1) for t in floats)


def loss_for(module: nn.Module) -> Loss:
    """The loss the engine trains ``module`` with (see the module docstring)."""
    from gpualloc.graph.zoo import GPT, BertModel, ResNet

    if isinstance(module, GPT):
        return Loss("next-token cross-entropy", _next_token_targets, _next_token)
    if isinstance(module, ResNet):
        classes = next(m for m in reversed(list(module.modules())) if isinstance(m, nn.Linear)).out_features
        return Loss(f"cross-entropy on seeded labels ({classes} classes)", _labels(classes), _classify(0))
    if isinstance(module, BertModel):
        hidden = module.config.hidden
        return Loss(f"cross-entropy of the pooled output on seeded labels ({hidden} classes)", _labels(hidden),
                    _classify(1))
    return Loss("mean of the floating-point outputs", _no_targets, _mean_outputs)
