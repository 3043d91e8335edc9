"""The user-item shape of the synthetic stream: no planted communities, power-law degrees.

Real interaction logs (ratings, plays, purchases) look little like the segmented default stream:
a few thousand users and items, every id in tens to hundreds of samples, co-access coming from
each user's own tastes rather than from communities the whole stream shares. This shape makes
such logs, so that a placement is measured on both kinds (issue 29):

* field 0 is the user: ``users`` ids whose activity is Zipf(``user_zipf``) over a fixed random
  order (power-law degrees, the most active users not simply the smallest ids);
* field 1 is the item: with probability ``taste_prob`` one of the user's ``taste_size`` items
  (drawn from the items' popularity when the user's taste was formed), else an item from the
  global popularity, Zipf(``item_zipf``) over ``items`` ids;
* the other fields are context (device, country, hour, ...), vocabularies log-spaced from
  ``vocab_min`` to ``context_max``: with probability ``context_user_prob`` a value fixed per
  user and field (a user's country), else a Zipf(``field_zipf``) draw;
* drift every ``drift_every`` records (preference drift): ``drift_fraction`` of the users form
  a new taste and as many item popularity ranks are reshuffled among themselves;
* labels as in the segmented shape (a logistic ground truth additive over (field, value)), plus
  ``taste_bonus`` on the logit when the item came from the user's taste.

Record ``i`` is a pure function of ``(config, i)``, as for the segmented shape.

``shape="user_history"`` adds field 2, the history: ``history_len`` items, each drawn as the
item field's (from the user's taste with probability ``taste_prob``, else from the global
popularity), so a user's history tells its taste; the item field's ground truth is unchanged.
With ``repeat_prob`` the item is, that often, one of the history's first ``repeat_window``
items (the user's last clicks) and its logit gains ``repeat_bonus`` instead of the taste's: a
signal in the item's relation to the history, which pooling the history into one mean hides.
The history is drawn after everything else of a block, so the other fields of a record are those
of the same record of ``user_item``.
"""

from __future__ import annotations

import numpy as np

from hetgmp.runtime import fmix64
from hetgmp.streaming.synthetic_config import SyntheticConfig, zipf_cdf

__all__ = ["UserItemShape", "context_vocab"]


def context_vocab(config: SyntheticConfig) -> np.ndarray:
    """Vocabulary of every field: users, items (the history's too), then the context fields."""
    history = [config.items] if config.shape == "user_history" else []
    contexts = config.n_sparse - 2 - len(history)
    sizes = np.round(np.geomspace(config.vocab_min, max(config.context_max, config.vocab_min),
                                  max(contexts, 1))).astype(np.int64)[:contexts]
    return np.concatenate([[config.users, config.items], history, sizes]).astype(np.int64)


class UserItemShape:
    """Field values of user-item records, block by block (see the module docstring).

    Args:
        config: The stream's settings (``shape="user_item"``).
    """

    def __init__(self, config: SyntheticConfig) -> None:
        self.config = c = config
        self.vocab = context_vocab(c)
        rng = np.random.default_rng([c.seed, 0x0515])
        self._user_order = rng.permutation(c.users)
        self._user_cdf = zipf_cdf(c.users, c.user_zipf)
        self._item_cdf = zipf_cdf(c.items, c.item_zipf)
        self._history = c.history_len if c.shape == "user_history" else 0
        self._first_ctx = 3 if self._history else 2  # the first context field
        contexts = c.n_sparse - self._first_ctx
        self._ctx_cdf = [zipf_cdf(int(v), c.field_zipf) for v in self.vocab[self._first_ctx:]]
        self._ctx_salt = rng.integers(0, 2**63, size=max(contexts, 1), dtype=np.uint64)
        self._epochs: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def _epoch(self, e: int) -> tuple[np.ndarray, np.ndarray]:
        """(item of each popularity rank, taste uint32 ``[users, taste_size]``) in epoch ``e``."""
        if e in self._epochs:
            return self._epochs[e]
        c = self.config
        rng = np.random.default_rng([c.seed, 3, e])
        if e == 0:
            popularity = rng.permutation(c.items)
            taste = self._draw_taste(rng, popularity, c.users)
        else:
            popularity, taste = self._epoch(e - 1)
            popularity, taste = popularity.copy(), taste.copy()
            k = max(1, int(round(c.drift_fraction * c.items)))
            ranks = rng.choice(c.items, size=min(k, c.items), replace=False)
            popularity[ranks] = popularity[rng.permutation(ranks)]
            users = rng.choice(c.users, size=max(1, int(round(c.drift_fraction * c.users))),
                               replace=False)
            taste[users] = self._draw_taste(rng, popularity, users.size)
        if len(self._epochs) > 8:  # bounded memory on endless streams
            self._epochs.pop(min(self._epochs))
        self._epochs[e] = (popularity, taste)
        return popularity, taste

    def _draw_taste(self, rng: np.random.Generator, popularity: np.ndarray,
                    users: int) -> np.ndarray:
        c = self.config
        ranks = np.searchsorted(self._item_cdf, rng.random((users, c.taste_size)), side="right")
        return popularity[np.minimum(ranks, c.items - 1)].astype(np.uint32)

    def values(self, rng: np.random.Generator, index: np.ndarray
               ) -> tuple[np.ndarray, np.ndarray]:
        """uint32 ``[B, slots]`` value indexes of records ``index`` (a slot per field, the
        history's ``history_len``) and the logit bonus of each (``taste_bonus`` where the item
        came from the user's taste)."""
        c = self.config
        n = index.size
        values = np.empty((n, c.n_sparse + max(self._history - 1, 0)), np.uint32)
        ctx = self._first_ctx + max(self._history - 1, 0)  # the first context slot
        rank = np.minimum(np.searchsorted(self._user_cdf, rng.random(n), side="right"),
                          c.users - 1)
        user = self._user_order[rank]
        values[:, 0] = user
        from_taste = rng.random(n) < c.taste_prob
        pick = rng.integers(0, c.taste_size, n)
        global_rank = np.minimum(np.searchsorted(self._item_cdf, rng.random(n), side="right"),
                                 c.items - 1)
        epoch = index // c.drift_every
        for e in np.unique(epoch):  # a block spans at most a couple of epochs
            rows = np.flatnonzero(epoch == e)
            popularity, taste = self._epoch(int(e))
            values[rows, 1] = np.where(from_taste[rows], taste[user[rows], pick[rows]],
                                       popularity[global_rank[rows]])
        own = rng.random((n, max(c.n_sparse - self._first_ctx, 0))) < c.context_user_prob
        for j, cdf in enumerate(self._ctx_cdf):
            vocab = int(self.vocab[self._first_ctx + j])
            fixed = (fmix64(user.astype(np.uint64) ^ self._ctx_salt[j]) % np.uint64(vocab))
            drawn = np.minimum(np.searchsorted(cdf, rng.random(n), side="right"), vocab - 1)
            values[:, ctx + j] = np.where(own[:, j], fixed.astype(np.int64), drawn)
        if self._history:
            k = self._history
            tasted = rng.random((n, k)) < c.taste_prob
            picks = rng.integers(0, c.taste_size, (n, k))
            ranks = np.minimum(np.searchsorted(self._item_cdf, rng.random((n, k)), side="right"),
                               c.items - 1)
            for e in np.unique(epoch):
                rows = np.flatnonzero(epoch == e)
                popularity, taste = self._epoch(int(e))
                values[rows, 2:2 + k] = np.where(tasted[rows], taste[user[rows, None], picks[rows]],
                                                 popularity[ranks[rows]])
        bonus = np.where(from_taste, c.taste_bonus, 0.0)
        if self._history and c.repeat_prob > 0:
            # A repeat: the item is one the user clicked last, and likelier clicked again.
            repeat = rng.random(n) < c.repeat_prob
            slot = 2 + rng.integers(0, c.repeat_window, n)
            values[repeat, 1] = values[np.flatnonzero(repeat), slot[repeat]]
            bonus = np.where(repeat, c.repeat_bonus, bonus)
        return values, bonus

