"""Host synchronisations: the ops after which a GPU waits for Python, found and named on any device.

An op whose result size or value the host must know (``.item()`` and ``bool()``/``int()`` of a tensor, which are
``aten._local_scalar_dense``; ``nonzero``, ``unique``, ``masked_select``, boolean-mask indexing,
``repeat_interleave`` without ``output_size``; ``.tolist()`` and ``.numpy()``) drains the GPU's queue and keeps
CUDA graphs out. ``SyncCounter`` records each one that runs while it is active, with the line of pmlm that called
it, so a test can say "0 per micro-batch" on a CPU and where a new one came from.

``host_kernel()`` marks code that exists only on the host (the CPU's blockwise dropout kernel draws its seed and
reads its masks there by design): its ops are not counted. A custom op's own implementation is never seen either:
the counter sees the op, as a GPU runs it.
"""

from __future__ import annotations

import contextlib
import threading
import traceback
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode

aten = torch.ops.aten
# ops that always read a value or a data-dependent size back to the host
_ALWAYS = {
    aten._local_scalar_dense.default,
    aten.nonzero.default,
    aten._unique.default,
    aten._unique2.default,
    aten.unique_dim.default,
    aten.unique_consecutive.default,
    aten.masked_select.default,
}
_BOOLEAN_INDEXING = {aten.index.Tensor, aten.index_put.default, aten.index_put_.default, aten._index_put_impl_.default}
_HOST_READS = ("tolist", "numpy")  # Tensor methods that copy values to Python, below the dispatcher
_PACKAGE = Path(__file__).resolve().parents[1]

_local = threading.local()


@contextlib.contextmanager
def host_kernel():
    """Ops inside run on the host by design and are not counted (module docstring)."""
    _local.depth = getattr(_local, "depth", 0) + 1
    try:
        yield
    finally:
        _local.depth -= 1


def _exempt() -> bool:
    return getattr(_local, "depth", 0) > 0


def synchronises(func, args, kwargs) -> bool:
    """Whether the aten op ``func`` on these arguments waits for the device."""
    if func in _ALWAYS:
        return True
    if func in _BOOLEAN_INDEXING:
        indices = args[1] if len(args) > 1 else kwargs.get("indices", ())
        return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in indices or ())
    if func is aten.repeat_interleave.Tensor or func is aten.repeat_interleave.self_Tensor:
        return kwargs.get("output_size") is None
    return False


def _caller() -> str:
    """The innermost line of pmlm (outside this module) on the stack: where a synchronisation came from."""
    for frame in reversed(traceback.extract_stack()):
        path = Path(frame.filename).resolve()
        if path.is_relative_to(_PACKAGE) and path != Path(__file__).resolve():
            return f"{path.relative_to(_PACKAGE.parent)}:{frame.lineno} in {frame.name}"
    return "outside pmlm"


class SyncCounter(TorchDispatchMode):
    """Records every synchronising op while active: ``events`` (op, where)."""

    def __init__(self) -> None:
        super().__init__()
        self.events: list[tuple[str, str]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if not _exempt() and synchronises(func, args, kwargs):
            self.events.append((str(func.overloadpacket.__name__), _caller()))
        return func(*args, **kwargs)

    def __enter__(self):
        self._methods = {name: getattr(torch.Tensor, name) for name in _HOST_READS}
        for name, method in self._methods.items():
            setattr(torch.Tensor, name, self._watched(name, method))
        return super().__enter__()

    def __exit__(self, *exc):
        try:
            return super().__exit__(*exc)
        finally:
            for name, method in self._methods.items():
                setattr(torch.Tensor, name, method)

    def _watched(self, name: str, method):
        counter = self

        def read(tensor, *args, **kwargs):
            # only where this counter is the active mode: inside an op's own implementation it is not
            if _get_current_dispatch_mode() is counter and not _exempt():
                counter.events.append((name, _caller()))
            return method(tensor, *args, **kwargs)

        return read

    def summary(self) -> str:
        """One line per distinct (op, where), with its count."""
        counts: dict[tuple[str, str], int] = {}
        for event in self.events:
            counts[event] = counts.get(event, 0) + 1
        return "\n".join(f"{n} x {op} at {where}" for (op, where), n in sorted(counts.items()))
