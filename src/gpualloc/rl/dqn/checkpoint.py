"""Checkpoint serialisation: spaces and user metadata as plain values that ``torch.load`` can read with
``weights_only=True`` (no arbitrary pickled objects are ever executed on load).

A checkpoint is one ``torch.save`` file holding a dict::

    format            "gpualloc.dqn"
    version           1
    config            dataclasses.asdict(DQNConfig)
    observation_space space_to_dict(...)   Box / Dict of Box
    action_space      space_to_dict(...)   Discrete
    qnet, target_net  state dicts
    optimizer         Adam state dict
    num_timesteps     environment steps taken while training
    num_updates       gradient steps taken
    rng_state         numpy bit-generator state of the exploration RNG
    extra             the caller's metadata, numpy arrays encoded by encode_value
"""

from __future__ import annotations

import numpy as np
import torch
from gymnasium import spaces

from gpualloc.errors import AgentError

FORMAT = "gpualloc.dqn"
VERSION = 1

_ND = "__ndarray__"
_PRIMITIVES = (type(None), bool, int, float, complex, str, bytes)


def encode_value(value, where: str = "extra"):
    """``value`` with numpy arrays and scalars turned into plain values; raises on anything else.

    Accepted: None, bool, int, float, complex, str, bytes, numpy scalars (stored as Python scalars),
    numpy arrays of any non-object dtype, torch tensors, and lists, tuples and dicts of these (dict
    keys must be primitives).
    """
    if isinstance(value, _PRIMITIVES):
        return value
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        if value.dtype.hasobject:
            raise AgentError(f"{where}: numpy arrays of dtype object cannot be stored in a checkpoint")
        arr = np.ascontiguousarray(value)
        return {_ND: arr.tobytes(), "dtype": arr.dtype.str, "shape": tuple(arr.shape)}
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            if not isinstance(k, _PRIMITIVES):
                raise AgentError(f"{where}: dict key {k!r} of type {type(k).__name__} cannot be stored")
            out[k] = encode_value(v, f"{where}[{k!r}]")
        return out
    if isinstance(value, (list, tuple)):
        items = [encode_value(v, f"{where}[{i}]") for i, v in enumerate(value)]
        return items if isinstance(value, list) else tuple(items)
    raise AgentError(f"{where}: a {type(value).__name__} cannot be stored in a checkpoint")


def decode_value(value):
    """Inverse of :func:`encode_value` (numpy arrays come back as fresh writable arrays)."""
    if isinstance(value, dict):
        if set(value) == {_ND, "dtype", "shape"}:
            return np.frombuffer(value[_ND], dtype=np.dtype(value["dtype"])).reshape(value["shape"]).copy()
        return {k: decode_value(v) for k, v in value.items()}
    if isinstance(value, list):
        return [decode_value(v) for v in value]
    if isinstance(value, tuple):
        return tuple(decode_value(v) for v in value)
    return value


def space_to_dict(space: spaces.Space) -> dict:
    """A Box, Discrete or Dict space as plain values (bounds kept bit-exact)."""
    if isinstance(space, spaces.Box):
        return {"type": "Box", "low": encode_value(space.low), "high": encode_value(space.high),
                "dtype": np.dtype(space.dtype).str}
    if isinstance(space, spaces.Discrete):
        return {"type": "Discrete", "n": int(space.n), "start": int(space.start)}
    if isinstance(space, spaces.Dict):
        return {"type": "Dict", "spaces": {k: space_to_dict(s) for k, s in space.spaces.items()}}
    raise AgentError(f"cannot store a {type(space).__name__} space (only Box, Discrete, Dict)")


def space_from_dict(data: dict) -> spaces.Space:
    """Inverse of :func:`space_to_dict`."""
    kind = data["type"]
    if kind == "Box":
        low, high = decode_value(data["low"]), decode_value(data["high"])
        return spaces.Box(low=low, high=high, shape=low.shape, dtype=np.dtype(data["dtype"]))
    if kind == "Discrete":
        return spaces.Discrete(int(data["n"]), start=int(data["start"]))
    if kind == "Dict":
        return spaces.Dict({k: space_from_dict(s) for k, s in data["spaces"].items()})
    raise AgentError(f"unknown space type {kind!r}")
