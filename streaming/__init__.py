"""Kafka I/O and everything about the click log: schema, decoding, producers, consumer, window.

No torch here. The names below are the package's public surface.
"""

from streaming.broker import BrokerUnavailable, EmbeddedBroker
from streaming.codec import DecodeConfig, Decoded, Decoder
from streaming.consumer import ClickConsumer, ConsumerConfig
from streaming.hashing import feature_id
from streaming.kafka import KafkaSettings, ensure_topic
from streaming.producer import ProduceConfig, produce
from streaming.synthetic import SyntheticConfig, SyntheticStream
from streaming.types import ClickBatch, Reject, RejectReason, Schema
from streaming.window import AccessWindow, WindowConfig

__all__ = [
    "AccessWindow",
    "BrokerUnavailable",
    "ClickBatch",
    "ClickConsumer",
    "ConsumerConfig",
    "DecodeConfig",
    "Decoded",
    "Decoder",
    "EmbeddedBroker",
    "KafkaSettings",
    "ProduceConfig",
    "Reject",
    "RejectReason",
    "Schema",
    "SyntheticConfig",
    "SyntheticStream",
    "WindowConfig",
    "ensure_topic",
    "feature_id",
    "produce",
]
