import subprocess
import sys

import numpy as np
import pytest

from hetgmp.streaming.hashing import feature_id, field_seeds, hash_spans

VALUES = [b"", b"a", b"68fd1e64", b"0123456789abcdef", b"0123456789abcdef0", b"x" * 100, "é".encode()]


def _spans(values: list[bytes]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    sizes = np.array([len(v) for v in values], dtype=np.int64)
    ends = np.cumsum(sizes)
    return np.frombuffer(b"".join(values) + b"\0", np.uint8), ends - sizes, ends


def test_vectorised_hash_equals_scalar_reference():
    buf, starts, ends = _spans(VALUES)
    got = hash_spans(buf, starts, ends, field_seeds(["C7"]))
    assert got.tolist() == [feature_id("C7", v) for v in VALUES]


def test_ids_are_non_negative_and_depend_on_field_and_value():
    assert feature_id("C1", "abc") != feature_id("C2", "abc")
    assert feature_id("C1", "abc") != feature_id("C1", "abd")
    assert feature_id("C1", "") != feature_id("C2", "")
    buf, starts, ends = _spans(VALUES)
    assert (hash_spans(buf, starts, ends, field_seeds(["C1"])) >= 0).all()


def test_padding_bytes_after_a_span_do_not_change_its_id():
    # Same value followed by different bytes in the buffer: same id.
    a = hash_spans(
        np.frombuffer(b"abc\xff\xff\xff\xff\xff\xff", np.uint8),
        np.array([0]),
        np.array([3]),
        field_seeds(["C1"]),
    )
    b = hash_spans(
        np.frombuffer(b"abc\x00\x01\x02\x03\x04\x05", np.uint8),
        np.array([0]),
        np.array([3]),
        field_seeds(["C1"]),
    )
    assert a[0] == b[0] == feature_id("C1", b"abc")


@pytest.mark.slow
def test_ids_are_stable_across_processes():
    # A fresh interpreter with a different hash seed must compute the same ids.
    code = (
        "from hetgmp.streaming.hashing import feature_id;"
        "print(','.join(str(feature_id(f, v)) for f in ('C1','C26') for v in ('', '68fd1e64', 'zz')))"
    )
    outs = set()
    for seed in ("0", "12345"):
        r = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            check=True,
            env={"PYTHONHASHSEED": seed, "PATH": "/usr/bin:/bin", "PYTHONPATH": ":".join(sys.path)},
        )
        outs.add(r.stdout.strip())
    here = ",".join(str(feature_id(f, v)) for f in ("C1", "C26") for v in ("", "68fd1e64", "zz"))
    assert outs == {here}
