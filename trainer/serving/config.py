"""``hetgmp serve``'s settings: where the model comes from and how requests are answered."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Literal

from hetgmp.streaming.clients import resolve

__all__ = ['ServeConfig']


@dataclass(frozen=True)
class ServeConfig:
    """Where the model comes from and how requests are answered."""

    checkpoint_dir: str = field(
        default="", metadata={"help": "the training job's checkpoint directory (required): "
                              "the newest complete checkpoint is loaded, or waited for"})
    model_topic: str = field(
        default="", metadata={"help": "the delta-log topic ('' = the one the checkpoint "
                              "names)"})
    host: str = field(default="127.0.0.1", metadata={
        "help": "address to listen on (0.0.0.0 for every interface)"})
    port: int = field(default=8500, metadata={"help": "port to listen on"})
    format: Literal["tsv", "json"] = field(default="tsv", metadata={
        "help": "record format of a request that names no Content-Type"})
    schema: str = field(default="criteo", metadata={
        "help": "fields, as the consumer's --consumer-schema ('criteo', '13,26', "
                "'label=y;dense=a,b;sparse=c,d', a schema file PATH.toml, multi_hot, "
                "user_history, or SHAPE+conversion)"})
    value_separator: str = field(default=",", metadata={
        "help": "tsv: the character between a list field's values (as the consumer's)"})
    max_body_bytes: int = field(default=8 << 20, metadata={
        "help": "largest request body (bigger ones get 413)"})
    max_records: int = field(default=65536, metadata={"help": "most records in one request"})
    max_record_bytes: int = field(default=65536, metadata={
        "help": "longer records are malformed"})
    threads: int = field(default=2, metadata={"help": "threads that decode and score "
                                              "(torch intra-op threads: 1 each)"})
    wait_s: float = field(default=0.0, metadata={
        "help": "how long to wait for a first checkpoint (0 = as long as it takes)"})
    follow: bool = field(default=True, metadata={
        "help": "follow the delta log (off: serve the checkpoint as it is)"})
    client: Literal["auto", "kafka-python", "confluent"] = field(default="auto", metadata={
        "help": "Kafka client library that follows the delta log: kafka-python, confluent "
                "(librdkafka), or auto (confluent where installed)"})
    delta_key_file: str = field(default="", metadata={
        "help": "apply only delta-log messages signed with the key in this file (the "
                "trainer's --delta-key-file; '' = an unsigned log)"})
    header_timeout_s: float = field(default=10.0, metadata={
        "help": "close a connection that has not sent a whole request head this long after "
                "it opened or after its last reply (idle keep-alive connections too)"})
    body_timeout_s: float = field(default=30.0, metadata={
        "help": "answer 408 to a request whose body has not arrived this long after its head"})
    memory_rows: int = field(default=0, metadata={
        "help": "most rows held in memory; past it the least recently used go to a disk tier "
                "under --disk-dir (0 = every row in memory)"})
    disk_dir: str = field(default="", metadata={
        "help": "parent of the disk tier (RocksDB; a directory of its own, removed at exit; "
                "with --memory-rows)"})
    max_inflight_bytes: int = field(default=64 << 20, metadata={
        "help": "most request-body bytes held in memory at once (reserved as a request's "
                "Content-Length, or --max-body-bytes without one); past it requests get 503 "
                "with Retry-After"})

    def __post_init__(self) -> None:
        resolve(self.client)  # an unknown or uninstalled client stops here, with what to do
        if self.format not in ("tsv", "json"):
            raise ValueError(f"format must be tsv or json, not {self.format!r}")
        if not 0 < self.port < 65536 and self.port != 0:
            raise ValueError(f"port {self.port} is not a TCP port")
        if self.max_body_bytes < 1 or self.max_records < 1 or self.threads < 1:
            raise ValueError("max_body_bytes, max_records and threads must be positive")
        if self.header_timeout_s <= 0 or self.body_timeout_s <= 0:
            raise ValueError("header_timeout_s and body_timeout_s must be positive")
        if self.max_inflight_bytes < self.max_body_bytes:
            raise ValueError(f"max_inflight_bytes ({self.max_inflight_bytes}) must hold one "
                             f"body of max_body_bytes ({self.max_body_bytes})")
        if self.wait_s < 0:
            raise ValueError("wait_s >= 0")
        if self.memory_rows < 0 or bool(self.memory_rows) != bool(self.disk_dir):
            raise ValueError("--memory-rows and --disk-dir go together (a disk tier), and "
                             "--memory-rows >= 0")
        if self.disk_dir:
            try:
                os.makedirs(self.disk_dir, exist_ok=True)
            except OSError as exc:
                raise ValueError(f"--disk-dir {self.disk_dir}: cannot create it "
                                 f"({exc.strerror})") from exc
            if not os.access(self.disk_dir, os.W_OK | os.X_OK):
                raise ValueError(f"--disk-dir {self.disk_dir}: not writable by this user")
