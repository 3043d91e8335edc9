"""The sync counter's CPU audit counts what would make a CUDA host wait, and nothing else."""

from __future__ import annotations

import threading

import pytest
import torch

from hetgmp.trainer.step import SyncCounter


def _counted(fn) -> dict[str, int]:
    with SyncCounter("cpu") as s:
        fn()
    assert s.count == sum(s.seen.values())
    return dict(s.seen)


x = torch.tensor([3, 1, 3, 0, 7])
mask = x > 1


@pytest.mark.parametrize(("fn", "name"), [
    (lambda: x.sum().item(), "_local_scalar_dense"),
    (lambda: int(x[0]), "_local_scalar_dense"),
    (lambda: bool((x > 0).all()), "_local_scalar_dense"),
    (lambda: torch.nonzero(mask), "nonzero"),
    (lambda: x[mask], "index"),
    (lambda: x.masked_select(mask), "masked_select"),
    (lambda: torch.unique(x), "_unique2"),
    (lambda: torch.unique_consecutive(x), "unique_consecutive"),
    (lambda: torch.equal(x, x), "equal"),
    (lambda: torch.repeat_interleave(x.clamp(min=0)), "repeat_interleave"),
    (lambda: x.clone().__setitem__(mask, 0), "index_put_"),
    (lambda: x.tolist(), "tolist"),
    (lambda: x.cpu().numpy(), "cpu"),
    (lambda: x.numpy(), "numpy"),
])
def test_each_waiting_operation_counts_once(fn, name: str) -> None:
    assert _counted(fn) == {name: 1}


def test_queued_work_is_not_counted() -> None:
    def queued() -> None:
        s, order = torch.sort(x)
        first = torch.ones_like(s, dtype=torch.bool)
        first[1:] = s[1:] != s[:-1]
        rank = torch.cumsum(first, 0) - 1
        torch.empty_like(rank).scatter_(0, order, rank)
        x.index_select(0, rank)
        x.clone()[torch.tensor([0, 2])] = 5
        torch.nonzero_static(mask, size=3)
        torch.where(mask, x, -1)
        torch.repeat_interleave(x.clamp(min=0), output_size=14)
        torch.stack([x.sum(), first.sum()])

    assert _counted(queued) == {}


def test_backward_passes_are_audited() -> None:
    w = torch.ones(5, requires_grad=True)

    def backward() -> None:
        # masked_fill is queued; its backward is too, but the loss read back is not.
        loss = (w.masked_fill(mask, 0.0) ** 2).sum()
        loss.backward()
        float(loss.detach())

    assert _counted(backward) == {"_local_scalar_dense": 1}


def test_the_audit_leaves_tensor_methods_as_they_were() -> None:
    before = (torch.Tensor.cpu, torch.Tensor.numpy, torch.Tensor.tolist)
    with SyncCounter("cpu"):
        pass
    assert (torch.Tensor.cpu, torch.Tensor.numpy, torch.Tensor.tolist) == before
    with SyncCounter("cpu") as s:
        x.tolist()
    x.tolist()  # after exit: not counted
    assert s.count == 1


def test_the_audit_counts_the_entering_thread_only() -> None:
    other = threading.Thread(target=lambda: (x.tolist(), x.cpu(), torch.nonzero(mask)))
    with SyncCounter("cpu") as s:
        other.start()
        other.join()
        x.tolist()
    assert dict(s.seen) == {"tolist": 1}


def test_counters_in_two_threads_leave_in_any_order() -> None:
    before = (torch.Tensor.cpu, torch.Tensor.numpy, torch.Tensor.tolist)
    entered, release = threading.Event(), threading.Event()
    other_count: list[int] = []

    def other() -> None:
        with SyncCounter("cpu") as s:
            entered.set()
            release.wait(5)
            x.tolist()
        other_count.append(s.count)

    t = threading.Thread(target=other)
    with SyncCounter("cpu") as mine:
        t.start()
        entered.wait(5)
        x.cpu().numpy()
    release.set()  # the other thread leaves last
    t.join()
    assert mine.count == 1 and other_count == [1]
    assert (torch.Tensor.cpu, torch.Tensor.numpy, torch.Tensor.tolist) == before


def test_a_thread_cannot_count_twice_at_once() -> None:
    with SyncCounter("cpu"):
        with pytest.raises(RuntimeError, match="not reentrant"):
            SyncCounter("cpu").__enter__()
