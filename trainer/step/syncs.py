"""Counting where the host waits for the device, on CUDA and (as an audit) on CPU.

On CUDA, torch reports every synchronising call under ``torch.cuda.set_sync_debug_mode``; that
is the ground truth, and :class:`SyncCounter` counts its warnings. A CPU has no stream to wait
for, so the same code runs there without a single wait; to check a device path in CI anyway,
the counter audits the operations that *would* wait on CUDA:

* operators whose result the host must read, or whose output size depends on data: a tensor
  read as a Python scalar (``_local_scalar_dense``: ``item``, ``int``, ``float``, ``bool``),
  ``nonzero``, ``masked_select``, the ``unique`` family, ``equal``, ``repeat_interleave``
  without ``output_size``, indexing (or indexed assignment) with a boolean mask;
* copies out to the host: ``Tensor.cpu``, ``Tensor.numpy``, ``Tensor.tolist`` (a ``.cpu()``
  followed by ``.numpy()`` of its result counts once).

The audit sees what runs through torch's dispatcher while the counter is entered, backward
passes included. It cannot tell a host tensor from a device one (on CPU they are the same), so
a path audited on CPU must not take CPU-only shortcuts through the host while it is counted;
code that does (:class:`~hetgmp.trainer.embedding.EmbeddingStore`'s numpy initialiser) has a
switch for it. For the same reason it misses copies *to* the device: on CUDA a copy from
pageable host memory waits (``trainer.step.trainer.to_device`` pins the step's inputs so that it does
not), on a CPU it is no copy at all. The CUDA count settles both.
"""

from __future__ import annotations

import threading
import warnings
from collections import Counter
from collections.abc import Callable
from types import TracebackType
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["SyncCounter"]

_aten = torch.ops.aten
# Operators that make a CUDA stream's host wait whatever their arguments.
_ALWAYS = {
    _aten._local_scalar_dense.default, _aten.nonzero.default, _aten.masked_select.default,
    _aten._unique.default, _aten._unique2.default, _aten.unique_dim.default,
    _aten.unique_consecutive.default, _aten.equal.default,
}
_INDEXED = {_aten.index.Tensor, _aten.index_put.default, _aten.index_put_.default,
            _aten._index_put_impl_.default}
_MASK_DTYPES = (torch.bool, torch.uint8)


def _waits(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether this operator call would wait for the device on CUDA."""
    if func in _ALWAYS:
        return True
    if func in _INDEXED:
        indices = args[1] if len(args) > 1 else kwargs.get("indices", ())
        return any(isinstance(i, torch.Tensor) and i.dtype in _MASK_DTYPES for i in indices)
    if func is _aten.repeat_interleave.Tensor:
        return kwargs.get("output_size") is None
    return False


class _Audit(TorchDispatchMode):
    def __init__(self, seen: Counter[str]) -> None:
        super().__init__()
        self._seen = seen

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        kwargs = kwargs or {}
        if _waits(func, args, kwargs):
            self._seen[str(func.overloadpacket.__name__)] += 1
        return func(*args, **kwargs)


class SyncCounter:
    """Counts the host's waits for ``device`` while entered (see the module docstring).

    On CUDA it counts what ``set_sync_debug_mode("warn")`` reports (process-wide: every
    thread's waits); elsewhere it audits the operations listed above, in the thread that
    entered it (counters in several threads may overlap). Not reentrant in one thread.

    Attributes:
        device: The device whose waits are counted.
        seen: On the audit, how many times each operation was counted (empty on CUDA).
    """

    def __init__(self, device: torch.device | str) -> None:
        self.device = torch.device(device)
        self.seen: Counter[str] = Counter()
        self._warnings: list[warnings.WarningMessage] = []
        self._exit: Callable[[], None] | None = None

    @property
    def count(self) -> int:
        """Waits counted so far (while entered too)."""
        return sum("synchroniz" in str(w.message) for w in self._warnings) + \
            sum(self.seen.values())

    def __enter__(self) -> SyncCounter:
        if self.device.type == "cuda":
            self._enter_cuda()
        else:
            self._enter_audit()
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 tb: TracebackType | None) -> None:
        assert self._exit is not None, "not entered"
        self._exit()
        self._exit = None

    def _enter_cuda(self) -> None:
        catcher = warnings.catch_warnings(record=True)
        recorded = catcher.__enter__()
        warnings.simplefilter("always")
        before = torch.cuda.get_sync_debug_mode()
        torch.cuda.set_sync_debug_mode("warn")
        self._warnings = recorded

        def leave() -> None:
            torch.cuda.set_sync_debug_mode(before)
            self._warnings = list(recorded)
            catcher.__exit__(None, None, None)

        self._exit = leave

    def _enter_audit(self) -> None:
        _copies_counted_for(self.seen)
        mode = _Audit(self.seen)
        mode.__enter__()

        def leave() -> None:
            mode.__exit__(None, None, None)
            _copies_counted_for(None)

        self._exit = leave


# Copies out are counted by patching Tensor.cpu/numpy/tolist once for every counter entered
# (in any thread), each thread's calls going to the counter that thread entered; the methods
# are restored when the last one leaves, in whatever order counters leave.
_COPIES = ("cpu", "numpy", "tolist")
_ORIGINALS = {name: getattr(torch.Tensor, name) for name in _COPIES}
_lock = threading.Lock()
_counting: dict[int, tuple[Counter[str], set[int]]] = {}  # thread -> (its counts, fetched ids)


def _copies_counted_for(seen: Counter[str] | None) -> None:
    """Count this thread's copies out into ``seen`` from now on (None: stop)."""
    me = threading.get_ident()
    with _lock:
        if seen is None:
            _counting.pop(me, None)
            if not _counting:
                for name, fn in _ORIGINALS.items():
                    setattr(torch.Tensor, name, fn)
            return
        if me in _counting:
            raise RuntimeError("SyncCounter is not reentrant: this thread is counting already")
        if not _counting:
            for name, fn in _PATCHES.items():
                setattr(torch.Tensor, name, fn)
        _counting[me] = (seen, set())  # the ids: tensors a counted .cpu() returned


def _cpu(t: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    out = _ORIGINALS["cpu"](t, *args, **kwargs)
    mine = _counting.get(threading.get_ident())
    if mine is not None:
        mine[0]["cpu"] += 1
        mine[1].add(id(out))
    return out


def _numpy(t: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
    mine = _counting.get(threading.get_ident())
    if mine is not None and id(t) not in mine[1]:  # the .numpy() of a counted .cpu() is free
        mine[0]["numpy"] += 1
    return _ORIGINALS["numpy"](t, *args, **kwargs)


def _tolist(t: torch.Tensor) -> Any:
    mine = _counting.get(threading.get_ident())
    if mine is not None:
        mine[0]["tolist"] += 1
    return _ORIGINALS["tolist"](t)


_PATCHES = {"cpu": _cpu, "numpy": _numpy, "tolist": _tolist}
