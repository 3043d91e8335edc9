"""The launcher: results come back by rank, and a failing or dying rank ends the job quickly."""

from __future__ import annotations

import multiprocessing as mp
import os
import time
from pathlib import Path

import pytest

from hetgmp.trainer.dist.launcher import WorkerFailed, gpus_needed, job_device, launch, resolve_device
from hetgmp.trainer.dist import LaunchConfig

pytestmark = pytest.mark.distributed


def test_results_come_back_in_rank_order(targets) -> None:
    results = launch(targets.gather_ranks, "x", LaunchConfig(workers=2, device="cpu"))
    assert results == [("x", [0, 1], "cpu"), ("x", [0, 1], "cpu")]
    assert launch(targets.gather_ranks, "y", LaunchConfig(device="cpu", workers=1)) == [("y", [0], "cpu")]


def test_ranks_see_the_environment_of_the_launch_and_its_thread_caps(targets, monkeypatch) -> None:
    # CPU ranks are forked from a fork server started at the first launch: without being told,
    # a rank would see the environment the server started with, not the launcher's now.
    names = ["HETGMP_TEST_MARK", "OMP_NUM_THREADS"]
    for mark in ("first", "second"):
        monkeypatch.setenv("HETGMP_TEST_MARK", mark)
        for threads in (1, 2):
            seen = launch(targets.environment, names,
                          LaunchConfig(device="cpu", workers=2, threads=threads))
            assert seen == [[mark, str(threads)]] * 2
    monkeypatch.delenv("HETGMP_TEST_MARK")
    assert launch(targets.environment, names, LaunchConfig(device="cpu", workers=2)) == \
        [[None, "1"]] * 2


@pytest.mark.parametrize("target,expected", [("raise_on", "ValueError: boom on rank 1"),
                                             ("die_on", "exited with code 3"),
                                             # the cause named, not the peer that lost it
                                             ("peer_lost_first", "exited with code 3")])
def test_a_failing_rank_stops_the_job_without_hanging(targets, target: str, expected: str) -> None:
    t0 = time.monotonic()
    # The collective timeout is far away: only the launcher's watch can end this quickly.
    with pytest.raises(WorkerFailed) as info:
        launch(getattr(targets, target), 1, LaunchConfig(device="cpu", workers=2, timeout_s=600))
    assert time.monotonic() - t0 < 60
    assert info.value.rank == 1 and expected in str(info.value)
    assert not mp.active_children()  # the surviving rank was stopped, not left behind


def test_all_reduce_sums_small_and_large_tensors_alike(targets) -> None:
    # 13 values go by all-gather and a local sum, 20k (160 kB) by gloo's ring: both must give
    # every rank the same sum, and count the bytes each way moves.
    sizes, world = [13, 20_000], 3
    results = launch(targets.reduce_sums, sizes, LaunchConfig(workers=world, device="cpu"))
    for i, n in enumerate(sizes):
        expected = [sum(k * (r + 1) + 0.1 * r for r in range(world)) for k in range(n)]
        values = [r[i][0] for r in results]
        assert values[0] == values[1] == values[2]  # the same bits on every rank
        assert values[0] == pytest.approx(expected, rel=1e-12)
    small, large = 13 * 8, 20_000 * 8
    assert [r[0][1] for r in results] == [(world - 1) * small] * world
    assert [r[1][1] for r in results] == [2 * (world - 1) * large // world] * world
    # Each sum is one timed collective; ranks 1 and 2 wait in it for rank 0's 0.5 s sleep.
    for rank, per_size in enumerate(results):
        for _, _, calls, seconds in per_size:
            assert calls == 1
            if rank:
                assert seconds > 0.25


def test_an_all_to_all_left_running_arrives_as_the_blocking_one_would(targets) -> None:
    # The row exchange starts its all-to-alls and reads its own rows while they travel.
    rows, world = 3, 3
    results = launch(targets.all_to_all_while_working, rows, LaunchConfig(device="cpu", workers=world))
    for me, (got, blocking, heard, before, after, calls) in enumerate(results):
        expected = [[1000 * src + 100 * me + r, -(1000 * src + 100 * me + r)]
                    for src in range(world) for r in range(rows)]
        assert got == expected
        assert blocking == expected
        assert heard == [10 + r for r in range(world)]
        # Counted once, when waited for: rows to the other ranks, two int64 each.
        assert before == 0
        assert after == (world - 1) * rows * 2 * 8
        assert calls == 2


def test_an_all_reduce_left_running_lets_other_collectives_through(targets) -> None:
    # The trainer leaves the dense all-reduce running into the next step, whose routing and
    # control collectives go out meanwhile: each must still meet its own peers.
    n, world = 50_000, 3
    results = launch(targets.reduce_while_exchanging, n, LaunchConfig(device="cpu", workers=world))
    expected = [k * sum(r + 1 for r in range(world)) for k in range(n)]
    for values, heard, before, after in results:
        assert values == pytest.approx(expected, rel=1e-12)
        assert heard == list(range(world)) + [10 + r for r in range(world)]
        assert before == 0  # counted when waited for, once
        assert after == 2 * (world - 1) * n * 8 // world


def test_ranks_keep_the_memory_a_step_frees_unless_told_not_to(targets) -> None:
    # glibc maps a block this large on its own (and unmaps it when freed: the next step faults
    # it in again); the launcher raises the threshold in every rank (trainer.dist.allocator).
    size = 24 << 20
    assert launch(targets.block_is_mapped, size,
                  LaunchConfig(device="cpu", workers=2)) == [False, False]
    assert launch(targets.block_is_mapped, size,
                  LaunchConfig(device="cpu", workers=2, keep_freed_memory=False)) == [True, True]


@pytest.mark.parametrize("n,ranks,auto", [(0, 1, "cpu"), (1, 1, "cuda"), (1, 2, "cpu"),
                                          (2, 2, "cuda"), (4, 2, "cuda")])
def test_cuda_needs_a_gpu_for_every_rank_of_the_machine(
    caplog: pytest.LogCaptureFixture, gpus, n: int, ranks: int, auto: str
) -> None:
    # NCCL refuses two ranks on one GPU: auto falls back to CPU and says why; cuda is refused.
    gpus(n)
    assert resolve_device("auto", ranks) == auto
    assert ("one needed per rank" in caplog.text) == (0 < n < ranks)
    assert resolve_device("cpu", ranks) == "cpu"
    if n >= ranks:
        assert resolve_device("cuda", ranks) == "cuda"
    else:
        with pytest.raises(ValueError, match=f"torch sees {n}|no CUDA device"):
            resolve_device("cuda", ranks)


def test_the_gpus_needed_are_those_of_the_ranks_of_this_machine(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    config = LaunchConfig(workers=3)
    assert gpus_needed(config) == 3  # the ranks this launcher starts
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setenv("RANK", "5")
    monkeypatch.setenv("WORLD_SIZE", "8")
    assert gpus_needed(config) == 8  # a launcher that does not say which ranks are local: all
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert gpus_needed(config) == 4  # torchrun's ranks on this machine, not --workers
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2")
    assert gpus_needed(config) == 1  # each process shown a GPU of its own
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")
    assert gpus_needed(config) == 4


def test_auto_across_machines_is_refused_and_the_fallback_said_once_per_machine(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, gpus
) -> None:
    gpus(1)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    for name, value in {"RANK": "1", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2",
                        "LOCAL_RANK": "1"}.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match="several machines"):
        job_device(LaunchConfig(device="auto"))
    assert job_device(LaunchConfig(device="cpu")) == "cpu"
    with pytest.raises(ValueError, match="torch sees 1"):
        job_device(LaunchConfig(device="cuda"))
    monkeypatch.setenv("WORLD_SIZE", "2")  # both ranks on this machine
    assert job_device(LaunchConfig(device="auto")) == "cpu"
    assert "one needed per rank" not in caplog.text  # local rank 1 leaves it to local rank 0
    monkeypatch.setenv("LOCAL_RANK", "0")
    assert job_device(LaunchConfig(device="auto")) == "cpu"
    assert "one needed per rank" in caplog.text


def test_an_unknown_device_is_refused() -> None:
    with pytest.raises(ValueError, match="expected auto, cpu or cuda"):
        resolve_device("tpu")


def _listening(pids: set[int]) -> list[tuple[str, int]]:
    """(address, port) of every TCP socket the processes ``pids`` listen on (from /proc)."""
    import socket
    import struct

    inodes = set()
    for pid in pids:
        fds = Path(f"/proc/{pid}/fd")
        for fd in fds.iterdir() if fds.is_dir() else []:
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    found = []
    for table, family in (("tcp", socket.AF_INET), ("tcp6", socket.AF_INET6)):
        for line in Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
            parts = line.split()
            if parts[3] != "0A" or parts[9] not in inodes:  # 0A: LISTEN
                continue
            hex_addr, hex_port = parts[1].split(":")
            raw = bytes.fromhex(hex_addr)
            # /proc prints each 32-bit word of the address in host (little-endian) order.
            words = struct.unpack(f"<{len(raw) // 4}I", raw)
            addr = socket.inet_ntop(family, struct.pack(f">{len(words)}I", *words))
            found.append((addr, int(hex_port, 16)))
    return found


@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="needs Linux's /proc")
def test_a_job_on_one_machine_listens_on_loopback_only(targets) -> None:
    """The rendezvous store and gloo's sockets bind 127.0.0.1, not every interface (the store
    of init_process_group's tcp:// method listened on all of them, IPv4 and IPv6)."""
    import multiprocessing
    import threading
    import time

    out: list = []
    runner = threading.Thread(target=lambda: out.append(launch(
        targets.hold, (4.0, None), LaunchConfig(device="cpu", workers=2, timeout_s=60))))
    runner.start()
    seen: set[tuple[str, int]] = set()
    deadline = time.monotonic() + 30
    while runner.is_alive() and time.monotonic() < deadline:
        ranks = {p.pid for p in multiprocessing.active_children() if p.pid}
        seen.update(_listening({os.getpid(), *ranks}))
        time.sleep(0.2)
    runner.join(60)
    assert out and len(out[0]) == 2
    assert seen, "the job's rendezvous store was not seen listening"
    assert all(addr in ("127.0.0.1", "::1") for addr, _ in seen), seen


def test_ranks_whose_launcher_was_killed_exit_by_themselves(tmp_path) -> None:
    """SIGKILL to the launcher: the ranks get SIGTERM (PR_SET_PDEATHSIG) and stop gracefully;
    one whose graceful stop hangs (here: it never looks at the stop) used to stay up for
    good, with nobody left to kill it after a grace period. Now it exits within two
    collective timeouts."""
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    here = Path(__file__).resolve().parents[1]  # tests/trainer: launch_targets
    script = (
        "import launch_targets\n"
        "from hetgmp.trainer.dist.launcher import launch, stop_event\n"
        "from hetgmp.trainer.dist import LaunchConfig\n"
        f"launch(launch_targets.hold, (600.0, {str(tmp_path)!r}),"
        " LaunchConfig(device='cpu', workers=2, timeout_s=1), stop_event())\n")
    env = {**os.environ, "PYTHONPATH": f"{here}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    launcher = subprocess.Popen([sys.executable, "-c", script], env=env, cwd=tmp_path)
    ranks: list[int] = []
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(ranks) < 2:
            ranks = [int(f.read_text()) for f in tmp_path.glob("rank*.pid")]
            time.sleep(0.2)
        assert len(ranks) == 2, "the ranks never started"
        time.sleep(0.5)  # into hold's sleep
        launcher.send_signal(signal.SIGKILL)
        launcher.wait(10)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and any(_alive(pid) for pid in ranks):
            time.sleep(0.2)
        left = [pid for pid in ranks if _alive(pid)]
    finally:
        for pid in {*ranks, *_descendants(launcher.pid)}:  # orphans are no longer its children
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
        if launcher.poll() is None:
            launcher.kill()
    assert not left, f"ranks {left} outlived their launcher"


def _descendants(pid: int) -> list[int]:
    from pathlib import Path

    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parents[int(stat.parent.name)] = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
    out, todo = [], [pid]
    while todo:
        kids = [p for p, parent in parents.items() if parent == todo[-1]]
        todo.pop()
        out += kids
        todo += kids
    return out


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has exited
    except OSError:
        return False


def test_host_data_goes_host_to_host_on_a_group_of_its_own_alike(targets) -> None:
    # On NCCL, headers, routed samples and the control vector ride a gloo group beside the
    # default one (DistComm.host_group); here both are gloo, and must deliver the same.
    rows, world = 2, 3
    results = launch(targets.host_collectives, rows, LaunchConfig(device="cpu", workers=world))
    for me, per_comm in enumerate(results):
        expected = [[1000 * src + 100 * me + r, r] for src in range(world) for r in range(rows)]
        for got, heard, summed, route_bytes in per_comm:
            assert got == expected
            assert heard == [10 + r for r in range(world)]
            assert summed == [3, 3 * 2**40 + 3, -3, 0, 14]  # the last two: maxima
            assert route_bytes == (world - 1) * rows * 2 * 8
