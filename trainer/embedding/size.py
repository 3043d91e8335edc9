"""What a store answers about its size, from its settings, row index and admission-candidate
index: shared by :class:`~hetgmp.trainer.embedding.store.EmbeddingStore` and the test suite's
numpy reference store."""

from __future__ import annotations

from typing import Protocol

from hetgmp.trainer.embedding.config import StoreConfig

__all__ = ["StoreSize"]


class _Sized(Protocol):
    @property
    def size(self) -> int: ...


class StoreSize:
    """What a store answers about its size, from its settings, row index and
    admission-candidate index (the test suite's numpy reference store shares it)."""

    config: StoreConfig
    _index: _Sized
    _cand: _Sized

    def __len__(self) -> int:
        return self._index.size

    @property
    def low_water(self) -> int:
        """Rows left when the cap ``max_rows`` is enforced (1/32 below it)."""
        cap = self.config.max_rows
        return cap - cap // 32

    @property
    def over_cap(self) -> bool:
        """More rows than ``max_rows`` (checked at the end of every step)."""
        return bool(self.config.max_rows) and self._index.size > self.config.max_rows

    @property
    def candidates(self) -> int:
        """Ids counted for admission that have no row yet."""
        return self._cand.size
