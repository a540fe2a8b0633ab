"""The precision recipes the engine trains in, as module transformations: one source for the engine's ranks
(:mod:`gpualloc.execute.engine.rank`), calibration's per-op timings (:mod:`gpualloc.cost.microbench`) and the
saved-activation count (:mod:`gpualloc.graph.activations`: what a recipe keeps in fp32)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor, nn

__all__ = ["NORMS", "OPTIMIZERS", "MasterWeights", "bf16_recipe", "cast_inputs"]


NORMS = (nn.LayerNorm, nn.GroupNorm, nn.modules.batchnorm._BatchNorm)
"""The modules the bf16 recipe computes in fp32 (:func:`bf16_recipe`)."""


def bf16_recipe(module: nn.Module, *, cast: bool = True) -> nn.Module:
    """Make ``module`` train in bf16 the way ``cost/memory.py`` charges it (mixed precision with fp32 master
    weights, as Megatron-LM and DeepSpeed run it): with ``cast`` every parameter and floating buffer in bfloat16
    (without it the parameters stay fp32: FSDP2's ``MixedPrecisionPolicy`` casts its own, :func:`wrap_replica`),
    so activations and gradients are bf16 too. The normalisation layers (:data:`NORMS`) keep bf16 parameters but
    compute in fp32: each runs its own forward on an fp32 copy of its input with fp32 copies of its weights
    (its running statistics stay fp32) and returns bf16, so its weight gradient is reduced over the batch in
    fp32 and rounded to bf16 once (Megatron's fused layer norm computes in fp32 too). Measured on ``gpt-tiny``:
    with bf16 norms a layer norm's gradient over a batch of 32 differs by up to 6% of the tensor's largest
    between the whole batch and two halves (a reduction over batch x sequence rows rounding in bf16); so, 0.7%.
    In place; returns ``module``."""
    from torch.nn.utils.stateless import _reparametrize_module

    def fp32_forward(m: nn.Module) -> Callable[..., Any]:
        own = type(m).forward

        def forward(*args: Any) -> Any:
            fp32 = {n: p.float() for n, p in m.named_parameters(recurse=False)}
            with _reparametrize_module(m, fp32):
                out = own(m, *(a.float() if isinstance(a, Tensor) and a.is_floating_point() else a for a in args))
            return out.to(torch.bfloat16) if isinstance(out, Tensor) and out.is_floating_point() else out

        return forward

    norm_buffers = set()
    for m in module.modules():
        if isinstance(m, NORMS):
            m.forward = fp32_forward(m)
            norm_buffers.update(id(b) for b in m.buffers())
    if cast:
        for m in module.modules():
            for t in [*m.parameters(recurse=False), *m.buffers(recurse=False)]:
                if id(t) not in norm_buffers and t.is_floating_point():
                    t.data = t.data.to(torch.bfloat16)  # in place: a tied weight stays one Parameter
    return module


def cast_inputs(inputs: Sequence[torch.Tensor], precision: str) -> tuple[torch.Tensor, ...]:
    """The model's inputs in the recipe's dtype: floating inputs (an image) bf16 for a bf16 plan; token ids as
    they are."""
    if precision != "bf16":
        return tuple(inputs)
    return tuple(t.to(torch.bfloat16) if t.is_floating_point() else t for t in inputs)


OPTIMIZERS: dict[str, type[torch.optim.Optimizer]] = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam}
"""The optimizers the engine trains with, by name (torch's defaults but the learning rate)."""


class MasterWeights:
    """An optimizer that steps fp32 master copies of low-precision parameters (Micikevicius et al., ICLR 2018).

    ``MasterWeights(params, optimizer_class, **defaults)``: for each bf16 parameter an fp32 copy (an fp32
    parameter is its own master); ``step`` casts each bf16 gradient to fp32 on its master (freeing the bf16
    one), steps ``optimizer_class`` over the masters, and copies them back into the bf16 parameters. Built over a
    ``ZeroRedundancyOptimizer`` partition it keeps masters and optimizer state of that shard only (ZeRO-1, where
    ``cost/memory.py`` puts them); ZeRO then broadcasts the bf16 parameters."""

    def __init__(self, params: Any, optimizer_class: type[torch.optim.Optimizer], **defaults: Any) -> None:
        groups = list(params)
        if groups and not isinstance(groups[0], dict):
            groups = [{"params": groups}]
        self.pairs: list[tuple[Tensor, Tensor]] = []
        masters = []
        for g in groups:
            ms = []
            for p in g["params"]:
                m = p if p.dtype == torch.float32 else p.detach().float().requires_grad_(True)
                self.pairs.append((p, m))
                ms.append(m)
            masters.append({**{k: v for k, v in g.items() if k != "params"}, "params": ms})
        self.optimizer = optimizer_class(masters, **defaults)

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return self.optimizer.param_groups

    @property
    def state(self) -> Any:
        return self.optimizer.state

    @property
    def defaults(self) -> dict[str, Any]:
        return self.optimizer.defaults

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p, m in self.pairs:
            p.grad = None
            m.grad = None

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        for p, m in self.pairs:
            if m is not p:
                m.grad = None if p.grad is None else p.grad.float()
                p.grad = None
        out = self.optimizer.step(closure) if closure is not None else self.optimizer.step()
        for p, m in self.pairs:
            if m is not p:
                p.copy_(m)
                m.grad = None
        return out

    def state_dict(self) -> dict[str, Any]:
        return self.optimizer.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state)
