"""The activations autograd saves for backward, measured by running the real model.

:func:`measure_saved_bytes` runs one forward pass and a loss of a module in train mode under
``torch.autograd.graph.saved_tensors_hooks`` and counts what the pack hook receives: each tensor an
autograd node keeps for its backward (an op's inputs, outputs, masks, statistics). Counting rules:

* by storage: a tensor saved twice, or a view of a saved tensor, counts once, with its whole storage's
  ``nbytes`` (what stays allocated), keyed on ``untyped_storage().data_ptr()``;
* parameters and buffers are not counted (they are weights, counted elsewhere);
* each storage belongs to the module (path, innermost) running when it was first saved; what the loss
  saves after the forward is ``loss_nbytes``;
* a storage is *unscaled* when lower-precision training keeps it at the bytes measured here: not floating point
  (indices, boolean masks), or saved inside a module the bf16 recipe computes in fp32
  (:data:`gpualloc.graph.recipe.NORMS`: it saves its fp32 copy of the input). The loss is unscaled too: the engine
  computes it in fp32 in every precision. Measured on ResNet-50 at batch 2 on the CPU, the recipe saves 77 % of
  the fp32 bytes, not half (BatchNorm), and the rule ``(all - unscaled) / 2 + unscaled`` gives what it saves;
* a storage is a *dropout mask* when a ``Dropout`` module saves it in floating point: on the CPU ``F.dropout``
  saves its mask in the input's dtype, on CUDA and ROCm ``native_dropout`` a one-byte boolean one (BERT-base at
  batch 16: 0.31 GB of fp32 masks measured here, 0.08 GB on a GPU).

:meth:`SavedActivations.per_layer` maps module paths onto a captured graph's layers, the runs of
consecutive ops with one ``OpNode.layer`` that :func:`gpualloc.graph.layers.layer_of_node`
numbers (capture sets ``layer`` to the innermost module path; a module with no op of its own there, such
as a train-mode ``Dropout`` that eval-mode tracing folds away, counts in its nearest enclosing layer).

References: PyTorch, "Hooks for saved tensors" (``torch.autograd.graph.saved_tensors_hooks``),
https://pytorch.org/tutorials/intermediate/autograd_saved_tensors_hooks_tutorial.html
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._pytree import tree_flatten

from gpualloc.errors import CaptureError
from gpualloc.graph.ir import OpGraph
from gpualloc.graph.layers import layer_of_node
from gpualloc.graph.recipe import NORMS

__all__ = ["SavedActivations", "default_loss", "layer_keys", "measure_saved_bytes"]


@dataclass(frozen=True)
class SavedActivations:
    """Bytes autograd saved for backward in one forward pass of ``batch`` samples.

    Attributes:
        batch: samples in the measured forward pass.
        saves: ``(module path, nbytes)`` per saved storage, in first-save order; the path is the innermost
            running module (``None``: the root module's own code).
        loss_nbytes: bytes the loss saved after the forward pass.
        weight_nbytes: bytes of the parameters and buffers autograd saved (each once), not in the total:
            references to the weights, which take no memory of their own.
        unscaled: for each of ``saves``, whether it is unscaled (see the module docstring); empty: none is.
        masks: for each of ``saves``, whether it is a dropout mask (see the module docstring); empty: none is.
    """

    batch: int
    saves: tuple[tuple[str | None, int], ...]
    loss_nbytes: int
    weight_nbytes: int = 0
    unscaled: tuple[bool, ...] = ()
    masks: tuple[bool, ...] = ()

    @property
    def total_nbytes(self) -> int:
        return sum(n for _, n in self.saves) + self.loss_nbytes

    def per_layer(self, graph: OpGraph, *, only: str | None = None) -> np.ndarray:
        """Saved bytes of each layer of ``graph`` (:func:`layer_keys` order) for ``batch`` samples, (L,); with
        ``only="unscaled"``, the unscaled bytes only (the loss's included), with ``only="masks"`` the dropout
        masks'.

        Saves are matched to layers in order: each goes to the first layer at or after the previous
        save's layer whose key is its module's (or nearest enclosing module's); with none there, or no
        layer for the module, it stays in the previous save's layer. The loss's bytes go to the last
        layer. The total is kept exactly.
        """
        keys = layer_keys(graph)
        out = np.zeros(len(keys))
        where: dict[str | None, list[int]] = {}
        for i, key in enumerate(keys):
            where.setdefault(key, []).append(i)
        at = 0
        if only not in (None, "unscaled", "masks"):
            raise ValueError(f"only: expected None, 'unscaled' or 'masks', got {only!r}")
        picked = {None: (True,) * len(self.saves), "unscaled": self.unscaled, "masks": self.masks}[only]
        for (path, nbytes), counted in zip(self.saves, picked or (False,) * len(self.saves), strict=True):
            runs = where.get(_enclosing_key(path, where), [])
            j = bisect.bisect_left(runs, at)
            at = runs[j] if j < len(runs) else at
            out[at] += nbytes if counted else 0
        if only != "masks":
            out[-1] += self.loss_nbytes
        return out

    def per_sample(self, graph: OpGraph, *, only: str | None = None) -> np.ndarray:
        """:meth:`per_layer` divided by ``batch``, (L,)."""
        return self.per_layer(graph, only=only) / self.batch


def layer_keys(graph: OpGraph) -> list[str | None]:
    """The ``layer`` key (``OpNode.layer``) of each layer of :func:`~gpualloc.graph.layers.layer_of_node`."""
    lo = layer_of_node(graph)
    keys: list[str | None] = [None] * (int(lo.max()) + 1)
    for i, layer in enumerate(lo.tolist()):
        keys[layer] = graph.nodes[i].layer
    return keys


def _enclosing_key(path: str | None, keys: dict[str | None, list[int]]) -> str | None:
    """``path`` or its nearest enclosing module with a layer; "" (no layer: stay) when there is none."""
    while path and path not in keys:
        path = path.rpartition(".")[0]
    return path


def default_loss(output: Any) -> torch.Tensor:
    """Cross-entropy of every floating output of two or more dimensions over its last dimension (logits
    of a classifier or language model, against class 0), plus the sum of any other floating output."""
    terms = []
    for t in tree_flatten(output)[0]:
        if isinstance(t, torch.Tensor) and t.is_floating_point() and t.requires_grad:
            if t.dim() >= 2:
                flat = t.reshape(-1, t.shape[-1])
                terms.append(F.cross_entropy(flat, torch.zeros(flat.shape[0], dtype=torch.long, device=t.device)))
            else:
                terms.append(t.sum())
    if not terms:
        raise CaptureError("saved activations: the model's output has no floating tensor that requires grad")
    return torch.stack(terms).sum() if len(terms) > 1 else terms[0]


def measure_saved_bytes(module: nn.Module, args: Sequence[Any], *, batch: int | None = None,
                        loss: Callable[[Any], torch.Tensor] | None = default_loss) -> SavedActivations:
    """Run ``module(*args)`` and ``loss`` of its output in train mode and count what autograd saves.

    The module is left as it was: training flags and buffers (BatchNorm statistics) are restored and the
    global RNG state is untouched (``torch.random.fork_rng``). No backward pass runs.

    Args:
        module: the model, on the device of ``args`` (CPU for an exact, reproducible count).
        args: positional inputs of one forward pass.
        batch: samples in ``args`` (default: the first dimension of the first tensor).
        loss: ``output -> scalar``; None: the forward pass only.

    Raises:
        CaptureError: no batch can be read from ``args``, or the forward pass or the loss failed (one line).
    """
    if batch is None:
        first = next((a for a in tree_flatten(list(args))[0] if isinstance(a, torch.Tensor) and a.dim()), None)
        if first is None:
            raise CaptureError("saved activations: pass batch, no input tensor has a batch dimension")
        batch = int(first.shape[0])
    weights = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
               for t in (*module.parameters(), *module.buffers())}
    seen: set[int] = set()
    seen_weights: set[int] = set()
    keep: list[Any] = []  # saved storages stay referenced, so a freed one's address is never reused
    saves: list[tuple[str | None, int]] = []
    unscaled: list[bool] = []
    masks: list[bool] = []
    stack: list[str | None] = [None]
    in_norm: list[bool] = [False]  # whether a module the bf16 recipe computes in fp32 is running
    in_dropout: list[bool] = [False]

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        ptr = storage.data_ptr()
        if ptr in weights:
            seen_weights.add(ptr)
        elif ptr and ptr not in seen:
            seen.add(ptr)
            keep.append(storage)
            saves.append((stack[-1], int(storage.nbytes())))
            unscaled.append(in_norm[-1] or not t.is_floating_point())
            masks.append(in_dropout[-1] and t.is_floating_point())
        return t

    def enter(mod: nn.Module, _args: Any) -> None:
        stack.append(names[id(mod)])
        in_norm.append(in_norm[-1] or isinstance(mod, NORMS))
        in_dropout.append(isinstance(mod, nn.modules.dropout._DropoutNd))

    def leave(_mod: nn.Module, _args: Any, _out: Any) -> None:  # returning None keeps the output
        stack.pop()
        in_norm.pop()
        in_dropout.pop()

    names = {id(m): path or None for path, m in module.named_modules()}
    hooks = [h for m in module.modules() for h in (m.register_forward_pre_hook(enter), m.register_forward_hook(leave))]
    modes = [(m, m.training) for m in module.modules()]
    buffers = [(b, b.detach().clone()) for b in module.buffers()]
    try:
        module.train()
        with torch.random.fork_rng(devices=[]), torch.enable_grad(), \
                torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            output = module(*args)
            n_forward = len(saves)
            if loss is not None:
                loss(output)
    except CaptureError:
        raise
    except Exception as err:  # noqa: BLE001 - one line, whatever the model raised
        raise CaptureError(f"saved activations: the train-mode forward pass failed: {type(err).__name__}: "
                           f"{str(err).splitlines()[0] if str(err) else ''}") from err
    finally:
        for h in hooks:
            h.remove()
        for m, training in modes:
            m.training = training
        with torch.no_grad():
            for b, value in buffers:
                b.copy_(value)
    return SavedActivations(int(batch), tuple(saves[:n_forward]), sum(n for _, n in saves[n_forward:]),
                            sum(weights[p] for p in seen_weights), tuple(unscaled[:n_forward]),
                            tuple(masks[:n_forward]))
