"""The named choices of pmlm as types: ``Choice``, the base of every such enum (a str that prints, formats and
serialises as its value, so tables, JSON, YAML and messages read as the strings did), and the two choices every
floor reads: the precision a run or command computes in and the device it computes on. Standard library only, so
the command layer takes its ``choices`` from them."""

from __future__ import annotations

import enum

from pmlm.errors import ConfigError


class Choice(str, enum.Enum):
    """A name checked once where it is read (``parse``, argparse's ``type=X.argument, choices=X.values()``)."""

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)

    @classmethod
    def values(cls) -> tuple[str, ...]:
        return tuple(member.value for member in cls)

    @classmethod
    def parse(cls, value, key: str):
        """The member named ``value``, else the one-line ``key must be one of a, b, got 'x'``."""
        if isinstance(value, str) and value in cls._value2member_map_:
            return cls(value)
        raise ConfigError(f"{key} must be one of {', '.join(cls.values())}, got {value!r}")

    @classmethod
    def argument(cls, text: str):
        """argparse's ``type``: the member, or ``text`` for argparse's ``choices`` to refuse in its own words."""
        return cls._value2member_map_.get(text, text)


class Precision(Choice):
    """The arithmetic of forward passes: recipes' ``bf16: true | false | auto``, commands' ``--precision`` (auto:
    the one the model's run recorded), model.json's ``precision``, the plan's byte sizes."""

    AUTO = "auto"
    FP32 = "fp32"
    BF16 = "bf16"

    @classmethod
    def of_recipe(cls, bf16) -> Precision:
        """A recipe's ``bf16: true | false | auto``."""
        if bf16 is True or bf16 is False or bf16 == "auto":
            return {True: cls.BF16, False: cls.FP32}.get(bf16, cls.AUTO)
        raise ConfigError(f"bf16 must be auto, true or false, got {bf16!r}")

    @property
    def bytes(self) -> int:
        """Bytes per element of a tensor in this precision (auto: as bf16, the precision a GPU run takes)."""
        return 4 if self is Precision.FP32 else 2

    def on(self, device: str) -> Precision:
        """The precision a run computes in on ``device`` (a torch device type): auto is bf16 on CUDA, fp32
        elsewhere; bf16 autocast runs on CUDA only."""
        if self is Precision.AUTO:
            return Precision.BF16 if device == Device.CUDA else Precision.FP32
        if self is Precision.BF16 and device != Device.CUDA:
            raise ConfigError("bf16 autocast is supported on CUDA only; set bf16: false (or auto) for CPU runs")
        return self


class Device(Choice):
    """Where a run or command computes (recipes' ``device``, commands' ``--device``): auto = CUDA when available."""

    AUTO = "auto"
    CPU = "cpu"
    CUDA = "cuda"
