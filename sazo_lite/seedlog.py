"""A whole ZO run as a replayable seed log: kilobytes instead of a checkpoint.

A MeZO run is fully determined by the initial weights and, per step, (seed, projected_grad)
plus the hyperparameters in force (lr, weight_decay per group). Replaying the log repeats the
very same in-place passes (perturb +εz, −2εz, restore-and-update), so the rounding matches
and the fine-tuned weights come back bit for bit on the same device and dtype, without a
single forward pass.

Example:
    >>> theta = torch.zeros(4)
    >>> opt = MeZO([theta], lr=0.1, seed=3)
    >>> log = SeedLog.attach(opt)
    >>> _ = opt.step(lambda: (theta - 1).pow(2))
    >>> copy = torch.zeros(4)
    >>> log.replay([copy])
    >>> torch.equal(copy, theta)
    True
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field

import numpy as np
import torch

from .engine import MeZO

__all__ = ["SeedLog"]

_STEP, _FAIL, _LR, _WD = 0, 1, 2, 3  # record kinds
_RECORD = np.dtype([("kind", "u1"), ("seed", "<u8"), ("value", "<f8")])  # 17 bytes


@dataclass
class SeedLog:
    """The per-step record of a MeZO run.

    Attributes:
        header: eps, per-group perturbation and tensor shapes, base seed and start step.
        records: (kind, seed-or-group, value) triples: a step (seed, g), a failed step
            (seed, failed call 1 or 2), or a change of a group's lr / weight_decay.
    """

    header: dict
    records: list[tuple[int, int, float]] = field(default_factory=list)
    _hyper: list[tuple[float, float]] = field(default_factory=list, repr=False)

    @classmethod
    def attach(cls, optimizer: MeZO) -> "SeedLog":
        """Start logging every later step of ``optimizer`` (from its current weights)."""
        state = optimizer.state[optimizer._first_param()]
        header = {"eps": optimizer.param_groups[0]["eps"], "base_seed": state["seed"],
                  "start_step": state["step"],
                  "groups": [{"perturbation": g["perturbation"],
                              "shapes": [list(p.shape) for p in g["params"]],
                              "dtypes": [str(p.dtype) for p in g["params"]]}
                             for g in optimizer.param_groups]}
        log = cls(header)
        optimizer.log = log
        return log

    def record_step(self, optimizer: MeZO, seed: int, projected_grad: float) -> None:
        """Called by ``MeZO`` just before it applies a step's update."""
        for index, group in enumerate(optimizer.param_groups):
            hyper = (group["lr"], group["weight_decay"])
            if index >= len(self._hyper) or self._hyper[index] != hyper:
                self.records += [(_LR, index, hyper[0]), (_WD, index, hyper[1])]
                self._hyper[index:index + 1] = [hyper]
        self.records.append((_STEP, seed, float(projected_grad)))

    def record_failure(self, seed: int, failed_call: int) -> None:
        """Called by ``MeZO`` when a closure failed: its shifts changed θ by rounding."""
        self.records.append((_FAIL, seed, float(failed_call)))

    @property
    def num_steps(self) -> int:
        return sum(kind == _STEP for kind, _, _ in self.records)

    def replay(self, params) -> None:
        """Apply the logged run in place to ``params`` (an iterable of tensors, or a module's
        ``parameters()``), which must hold the run's initial weights."""
        params = list(params)
        groups, start = [], 0
        for spec in self.header["groups"]:
            count = len(spec["shapes"])
            chunk = params[start:start + count]
            if [list(p.shape) for p in chunk] != spec["shapes"]:
                raise ValueError("Invalid params: shapes differ from the logged run's parameters")
            groups.append({"params": chunk, "perturbation": spec["perturbation"]})
            start += count
        if start != len(params):
            raise ValueError(f"Invalid params: expected {start} tensors, got {len(params)}")
        optimizer = MeZO(groups, lr=0.0, eps=self.header["eps"])
        for kind, key, value in self.records:
            self._apply(optimizer, kind, key, value)

    @staticmethod
    def _apply(optimizer: MeZO, kind: int, key: int, value: float) -> None:
        if kind == _STEP:
            optimizer.replay_step(key, value)
        elif kind == _FAIL:
            optimizer.replay_failure(key, int(value))
        else:
            optimizer.param_groups[key]["lr" if kind == _LR else "weight_decay"] = value

    def to_bytes(self) -> bytes:
        """Serialise: a JSON header line, then 17 bytes per record."""
        table = np.array(self.records, dtype=_RECORD)
        return json.dumps(self.header).encode() + b"\n" + table.tobytes()

    @classmethod
    def from_bytes(cls, data: bytes) -> "SeedLog":
        head, _, body = data.partition(b"\n")
        table = np.frombuffer(body, dtype=_RECORD)
        records = [(int(k), int(s), float(v)) for k, s, v in table]
        return cls(json.loads(head), records)

    def save(self, path) -> int:
        """Write the log to ``path``; returns its size in bytes."""
        data = self.to_bytes()
        with open(path, "wb") as handle:
            handle.write(data)
        return len(data)

    @classmethod
    def load(cls, path) -> "SeedLog":
        with open(path, "rb") as handle:
            return cls.from_bytes(handle.read())
