"""Rank functions for the launcher tests (a plain module: spawned ranks import it by name)."""

from __future__ import annotations

import os
import time

from hetgmp.trainer.dist import KINDS
from hetgmp.trainer.dist.comm import Comm


def gather_ranks(comm: Comm, tag: str) -> tuple[str, list[int], str]:
    """Every rank's id, through a collective."""
    return tag, comm.all_gather_object(comm.rank), str(comm.device)


def environment(comm: Comm, names: list[str]) -> list[str | None]:
    """What this rank sees of the environment variables ``names``."""
    return [os.environ.get(n) for n in names]


def raise_on(comm: Comm, rank: int) -> None:
    """Rank ``rank`` raises; the others wait in a collective that can never complete."""
    if comm.rank == rank:
        raise ValueError(f"boom on rank {rank}")
    comm.barrier()


def die_on(comm: Comm, rank: int) -> None:
    """Rank ``rank`` exits without a word (as if killed); the others wait in a collective."""
    if comm.rank == rank:
        os._exit(3)
    comm.barrier()


def peer_lost_first(comm: Comm, rank: int) -> None:
    """The order a loaded machine can give: the survivors' collective fails (PeerLost) before
    rank ``rank``'s death reaches the launcher (it exits 0.5 s later)."""
    import time

    from hetgmp.trainer.dist.peers import PeerLost

    if comm.rank == rank:
        time.sleep(0.5)
        os._exit(3)
    raise PeerLost(f"the barrier collective failed on rank {comm.rank}: rank {rank} is gone",
                   [rank], [])


def reduce_sums(comm: Comm, sizes: list[int]) -> list[tuple[list[float], int, int, float]]:
    """``all_reduce_sum`` of a rank-dependent float64 tensor of each size: (result, bytes sent,
    collectives timed, seconds in them)."""
    import torch

    out = []
    for n in sizes:
        x = torch.arange(n, dtype=torch.float64) * (comm.rank + 1) + 0.1 * comm.rank
        comm.barrier()  # every rank starts together ...
        before = comm.traffic.copy()
        if comm.rank == 0:
            time.sleep(0.5)  # ... and the others wait for rank 0 inside the collective
        comm.all_reduce_sum(x, "control")
        moved = comm.traffic - before
        out.append((x.tolist(), int(moved.sent.sum()), int(moved.calls.sum()),
                    float(moved.seconds.sum())))
    return out


def reduce_while_exchanging(comm: Comm, n: int) -> tuple[list[float], list[int], int, int]:
    """``start_all_reduce_sum`` of ``n`` float64 values left running across an all-to-all:
    (the sum, what the all-to-all brought, dense bytes counted before the wait, after it)."""
    import numpy as np
    import torch

    x = torch.arange(n, dtype=torch.float64) * (comm.rank + 1)
    pending = comm.start_all_reduce_sum(x)
    dense = KINDS.index("dense")
    before = int(comm.traffic.sent[dense])
    mine = torch.full((comm.world,), comm.rank, dtype=torch.int64)
    heard = comm.all_to_all(mine, [1] * comm.world, [1] * comm.world, "header")
    counts = comm.exchange_counts(np.full((comm.world, 1), 10 + comm.rank), "header")
    pending.wait()
    pending.wait()  # a second wait is a no-op (counted once)
    after = int(comm.traffic.sent[dense])
    return x.tolist(), heard.tolist() + counts[:, 0].tolist(), before, after


def all_to_all_while_working(comm: Comm, rows: int) -> tuple[list, list, list, int, int, int]:
    """``start_all_to_all`` of ``rows`` rows for each rank, left running across a count
    exchange: (what arrived, what the blocking ``all_to_all`` of the same rows brings, the
    counts heard meanwhile, request bytes sent before the wait, after it, request calls)."""
    import numpy as np
    import torch

    request = KINDS.index("request")
    world, me = comm.world, comm.rank
    # Row r of the block for rank d: 1000 * me + 100 * d + r, two columns.
    send = torch.tensor([[1000 * me + 100 * d + r, -(1000 * me + 100 * d + r)]
                         for d in range(world) for r in range(rows)], dtype=torch.int64)
    arriving = comm.start_all_to_all(send, [rows] * world, [rows] * world, "request")
    before = int(comm.traffic.sent[request])
    heard = comm.exchange_counts(np.full((world, 1), 10 + me), "header")
    got = arriving.wait()
    again = arriving.wait()  # a second wait returns the same rows and counts nothing
    assert again is got
    after = int(comm.traffic.sent[request])
    blocking = comm.all_to_all(send, [rows] * world, [rows] * world, "request")
    calls = int(comm.traffic.calls[request])
    return got.tolist(), blocking.tolist(), heard[:, 0].tolist(), before, after, calls


def route_steps(comm: Comm, sizes: list[list[int]]) -> list[tuple[bool, list, int]]:
    """``Trainer._prepare`` and ``_route`` of steps whose per-rank batch sizes are
    ``sizes[step][rank]``, with a global batch of twice the first step's first size.

    Returns per step: whether the header rode with the samples, the samples trained here (their
    ids, as lists) and the route and header bytes this rank sent.
    """
    import numpy as np

    from hetgmp.streaming.synthetic import SyntheticConfig, SyntheticStream
    from hetgmp.trainer.dist import KINDS, StepCounters
    from hetgmp.trainer.model import ModelConfig
    from hetgmp.trainer.run import graph_placement
    from hetgmp.trainer.sources import synthetic_batch
    from hetgmp.trainer.step import TrainConfig, Trainer

    stream = SyntheticStream(SyntheticConfig(vocab_max=5_000, seed=5))
    train = TrainConfig(global_batch=2 * sizes[0][0], replica_fraction=0.05, route_epsilon=0.0,
                        route="on")
    placement = graph_placement(stream.feature_ids(0, 5_000), comm.world, train)
    trainer = Trainer(comm, placement, 26, 13, model=ModelConfig(embed_dim=4, hidden=(8,)),
                      train=train)
    out, start = [], 5_000
    for step in sizes:
        lo = start + int(np.sum(step[:comm.rank]))
        kinds = [KINDS.index("route"), KINDS.index("header")]
        before = int(comm.traffic.sent[kinds].sum())
        merged = trainer._whole_batches
        batch = synthetic_batch(stream, lo, step[comm.rank])
        routed = trainer._route(batch, False, StepCounters(), trainer._prepare(batch))
        assert routed is not None
        sent = int(comm.traffic.sent[kinds].sum()) - before
        out.append((merged, routed[0].ids.tolist(), sent))
        start += int(np.sum(step))
    return out


def local_view_reads(comm: Comm, _: object) -> list[tuple[str, bool, bool]]:
    """``read_only(replicas=True)`` (the rank's own view) on 2 ranks: before any copy is
    filled, after a step, and with a copy of a row the rank still owns (as a migration leaves
    them). Returns per case: its name, whether the rows checked are the expected ones (the
    owners' rows, or the copies once filled), and whether every row read is non-zero.
    """
    import numpy as np
    import torch

    from hetgmp.partitioner import Placement
    from hetgmp.streaming.types import ClickBatch
    from hetgmp.trainer.model import ModelConfig
    from hetgmp.trainer.step import TrainConfig, Trainer

    ids = np.arange(1, 9, dtype=np.int64)
    owners = np.array([0, 0, 0, 0, 1, 1, 1, 1])
    placement = Placement(0, 2, ids, owners, (np.array([5, 6]), np.array([1, 2])))
    trainer = Trainer(comm, placement, 2, 1, model=ModelConfig(embed_dim=4, hidden=(8,)),
                      train=TrainConfig(staleness=5, global_batch=8, route="off"))
    batch = ClickBatch.of_ids(labels=np.array([1, 0, 1, 0], np.float32),
                       dense=np.ones((4, 1), np.float32), ids=ids.reshape(4, 2),
                       partitions=np.zeros(4, np.int32), offsets=np.arange(4, dtype=np.int64),
                       timestamps_ms=np.zeros(4, np.int64))
    ex, out = trainer.exchange, []

    def check(name: str, rows: np.ndarray, expected: torch.Tensor) -> None:
        mine = ex.read_only(ids, replicas=True)
        out.append((name, bool(torch.equal(mine[rows - 1], expected)),
                    bool((mine != 0).any(1).all())))

    check("unfilled copies", ids, ex.read_only(ids, replicas=False))
    trainer.step(batch)  # fills the copies (s = 5: their updates stay pending, unpushed)
    copies = trainer.replicas.ids
    check("filled copies", copies, trainer.replicas.read(trainer.replicas.slots(copies)))
    trainer.flush()
    # A migration is under way: the new replica sets are in the table, but rank 0 still owns
    # row 3, which it will replicate once the row has moved away.
    trainer.replace_replicas((np.array([3, 5, 6]), np.array([1, 2])))
    trainer.set_placement(Placement(1, 2, ids, owners, (np.array([5, 6]), np.array([1, 2]))))
    check("copy of a row still owned here", np.array([3, 4]),
          ex.read_only(np.array([3, 4]), replicas=False))
    return out


def block_is_mapped(comm: Comm, nbytes: int) -> bool:
    """Whether glibc's malloc serves a block of ``nbytes`` with a mapping of its own (counted
    by ``mallinfo2``) rather than from its heap."""
    import ctypes

    class MallInfo2(ctypes.Structure):
        _fields_ = [(name, ctypes.c_size_t) for name in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
            "fordblks", "keepcost")]

    libc = ctypes.CDLL(None)
    libc.mallinfo2.restype = MallInfo2
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    before = libc.mallinfo2().hblks
    block = libc.malloc(nbytes)
    mapped = libc.mallinfo2().hblks > before
    libc.free(block)
    comm.barrier()
    return bool(mapped)


def hold(comm: Comm, arg: tuple[float, str | None]) -> int:
    """Join the group, exchange a little, and stay up ``seconds`` (for a look from outside:
    given a directory, each rank leaves its pid there in ``rank<R>.pid``)."""
    import os
    import time

    import torch

    t = torch.ones(4)
    comm.all_reduce_sum(t)
    comm.barrier()
    seconds, where = arg
    if where is not None:
        path = os.path.join(where, f"rank{comm.rank}.pid")
        with open(path + ".tmp", "w") as f:
            f.write(str(os.getpid()))
        os.replace(path + ".tmp", path)
    time.sleep(seconds)
    comm.barrier()
    return os.getpid()


def host_collectives(comm: Comm, rows: int) -> list[tuple[list, list, list, int]]:
    """The host collectives on the default group and on a gloo group of their own (what a
    NCCL job carries host data on): per communicator, (what ``host_all_to_all`` brought, the
    counts ``exchange_counts`` heard, the control sum, route bytes sent)."""
    import numpy as np

    from hetgmp.trainer.dist.comm import DistComm

    world, me = comm.world, comm.rank
    side = DistComm(comm.device, host_group=True)  # collective: every rank builds it
    assert side.host_group is not None and getattr(comm, "host_group", None) is None
    out = []
    for c in (comm, side):
        send = np.array([[1000 * me + 100 * d + r, r] for d in range(world) for r in range(rows)
                         ], dtype=np.int64)
        got = c.host_all_to_all(send, [rows] * world, [rows] * world, "route")
        heard = c.exchange_counts(np.full((world, 1), 10 + me), "header")
        summed = c.host_all_reduce_sum(np.array([me, 2**40 + me, -me, -me, 7 * me]), "control",
                                       max_last=2)
        out.append((got.tolist(), heard[:, 0].tolist(), summed.tolist(),
                    int(c.traffic.sent[KINDS.index("route")])))
    return out
