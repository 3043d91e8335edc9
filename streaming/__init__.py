"""Kafka I/O and everything about the click log: schema, decoding, producers, consumer, window.

No torch here. The names below are the package's public surface.
"""

from hetgmp.streaming.arrow import batch_to_arrow, ipc_message
from hetgmp.streaming.broker import BrokerUnavailable, EmbeddedBroker
from hetgmp.streaming.clients import CommitError
from hetgmp.streaming.codec import DecodeConfig, Decoded, Decoder
from hetgmp.streaming.consumer import ClickConsumer, ConsumerConfig
from hetgmp.streaming.hashing import feature_id
from hetgmp.streaming.kafka import (
    ConnectStopped,
    KafkaRefused,
    KafkaSettings,
    KafkaUnavailable,
    TopicNotFound,
    connect_with_retry,
    ensure_topic,
    topic_partitions,
)
from hetgmp.streaming.metrics import ConsumerCollector, ProducerCollector, WindowCollector, serve_metrics
from hetgmp.streaming.positions import ConsumerFailed, LogLost
from hetgmp.streaming.prefetch import Prefetcher
from hetgmp.streaming.producer import ProduceConfig, ProduceFailed, ProduceReport, produce
from hetgmp.streaming.schema_file import parse_schema
from hetgmp.streaming.synthetic import SyntheticConfig, SyntheticStream, auc
from hetgmp.streaming.types import MAX_DIM, ClickBatch, Reject, RejectReason, Schema, SchemaError
from hetgmp.streaming.window import AccessWindow, WindowConfig

__all__ = [
    "MAX_DIM",
    "AccessWindow",
    "BrokerUnavailable",
    "ClickBatch",
    "ClickConsumer",
    "CommitError",
    "ConnectStopped",
    "ConsumerCollector",
    "ConsumerConfig",
    "ConsumerFailed",
    "DecodeConfig",
    "Decoded",
    "Decoder",
    "EmbeddedBroker",
    "KafkaRefused",
    "KafkaSettings",
    "KafkaUnavailable",
    "LogLost",
    "ProduceConfig",
    "ProduceFailed",
    "ProduceReport",
    "ProducerCollector",
    "Prefetcher",
    "Reject",
    "RejectReason",
    "Schema",
    "SchemaError",
    "SyntheticConfig",
    "SyntheticStream",
    "TopicNotFound",
    "WindowCollector",
    "WindowConfig",
    "auc",
    "batch_to_arrow",
    "connect_with_retry",
    "ensure_topic",
    "feature_id",
    "ipc_message",
    "parse_schema",
    "produce",
    "serve_metrics",
    "topic_partitions",
]
