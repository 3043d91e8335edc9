"""Building a model: what its factory is given, where the factory comes from, and the check
that refuses a model before any rank starts.

``--model`` names a built-in (``deepfm``, ``din``, ...: :data:`~hetgmp.trainer.model.zoo.BUILTINS`)
or a factory of the user's, ``package.module:function``. A factory takes a :class:`ModelSpec`
and returns a ``torch.nn.Module`` on the model contract
(:mod:`hetgmp.trainer.model.features`). It is called under the seed of ``ModelConfig.seed``,
so every rank builds the same parameters.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

from hetgmp.trainer.model.config import ModelConfig
from hetgmp.trainer.model.features import Features, Sequence
from hetgmp.trainer.model.pooling import Bags

__all__ = ["ModelError", "ModelSpec", "build_model", "check_model", "resolve_factory"]

_SEEDING = threading.Lock()


class ModelError(ValueError):
    """A model that cannot train on this schema: one line naming the model and what is
    wrong."""


@dataclass(frozen=True)
class ModelSpec:
    """What a model factory is given.

    Attributes:
        config: The model settings (``--model``, ``--embed-dim``, ``--hidden``, ...).
        pooled: The fields pooled to one row each, in schema order (``features.pooled``).
        sequences: ``(name, max_len)`` of each field kept as a sequence
            (``pooling = "none"``: ``features.sequences``).
        n_dense: Dense features.
        widths: ``(field, width)`` of every sparse field's row as the model reads it: its
            table's ``dim``, one more with a first-order weight in column 0 (empty: every
            field ``config.row_dim``).
        vectors: ``(field, dim)``: each field's vector width (its row without a first-order
            weight; empty: ``config.embed_dim``).
        tasks: Logit columns the model returns (one per label; 1: ``[B]`` or ``[B, 1]``).
        tables: ``(field, table)`` of every sparse field: fields that share a table read the
            same rows (DIN's candidate item and the history of items).
        labels: The labels' names, in the order of the logit columns (empty: one, unnamed).
    """

    config: ModelConfig
    pooled: tuple[str, ...]
    n_dense: int
    sequences: tuple[tuple[str, int], ...] = field(default=())
    tasks: int = 1
    tables: tuple[tuple[str, str], ...] = field(default=())
    labels: tuple[str, ...] = field(default=())
    widths: tuple[tuple[str, int], ...] = field(default=())
    vectors: tuple[tuple[str, int], ...] = field(default=())

    def width_of(self, name: str) -> int:
        """Width of field ``name``'s row as the model reads it."""
        return dict(self.widths).get(name, self.config.row_dim)

    @property
    def pooled_width(self) -> int:
        """The pooled fields' widths summed (the width of ``features.concat()``)."""
        return sum(self.width_of(n) for n in self.pooled)

    def one_width(self, model: str) -> int:
        """The one width of every pooled field's row.

        Raises:
            ModelError: The pooled fields have several (a model that stacks them)."""
        widths = {self.width_of(n) for n in self.pooled}
        if len(widths) > 1:
            shown = ", ".join(f"{n} {self.width_of(n)}" for n in self.pooled[:6])
            raise ModelError(f"model {model!r} needs one row width for every pooled field; "
                             f"this schema's have several ({shown}): drop the tables' dim or "
                             "use a model that reads features.concat() (dcn, mmoe, din, yours)")
        return widths.pop() if widths else self.config.row_dim

    def require_first_order(self, model: str) -> None:
        """Refuse pooled fields whose rows carry no first-order weight."""
        lacking = [n for n in self.pooled if self.width_of(n) == self.vector_width(n)]
        if lacking:
            raise ModelError(f"model {model!r} reads a first-order weight of every field; "
                             f"{', '.join(lacking[:6])}: first_order = false")

    def vector_width(self, name: str) -> int:
        """Width of field ``name``'s vector (its row without a first-order weight)."""
        return dict(self.vectors).get(name, self.config.embed_dim)

    def require_one_task(self, model: str) -> None:
        """Refuse a schema of several labels (a model with one logit)."""
        if self.tasks > 1:
            raise ModelError(f"model {model!r} predicts one label; the schema has {self.tasks} "
                             f"({', '.join(self.labels)}): use a multi-task model (mmoe) or "
                             "your own")

    def table_of(self, name: str) -> str:
        """The table field ``name`` looks up (its own name when not given)."""
        return dict(self.tables).get(name, name)

    @property
    def row_dim(self) -> int:
        """The one width of every pooled field's row (see :meth:`one_width`)."""
        return self.one_width(self.config.model)

    @classmethod
    def of_bags(cls, config: ModelConfig, bags: Bags, n_fields: int, n_dense: int) -> ModelSpec:
        """What a factory is given for ``n_fields`` sparse fields set up as ``bags`` say."""
        names = bags.field_names(n_fields)
        sequences = set(bags.sequences)
        w = bags.widths(config, n_fields)
        return cls(config, tuple(n for i, n in enumerate(names) if i not in sequences),
                   n_dense, tuple((names[i], bags.max_len[i]) for i in sorted(sequences)),
                   tasks=bags.tasks, tables=tuple(zip(names, bags.tables or names)),
                   labels=bags.labels,
                   widths=tuple((n, w.width(i)) for i, n in enumerate(names)),
                   vectors=tuple(zip(names, w.dims)))

    @classmethod
    def of_fields(cls, config: ModelConfig, n_fields: int, n_dense: int) -> ModelSpec:
        """A spec of ``n_fields`` pooled fields named ``f0, f1, ...`` (no schema at hand)."""
        return cls(config, tuple(f"f{i}" for i in range(n_fields)), n_dense)

    def require_pooled_only(self, model: str) -> None:
        """Refuse sequence fields (a model that reads pooled rows alone)."""
        if self.sequences:
            raise ModelError(f"model {model!r} reads pooled fields only; the schema keeps "
                             f"{', '.join(n for n, _ in self.sequences)} as a sequence "
                             "(pooling = \"none\"): pool it or use a model that reads sequences "
                             "(din)")

    def example(self, batch: int = 2, dtype: torch.dtype = torch.float32) -> Features:
        """Features of ``batch`` records shaped as this spec says (zeros, every sequence at
        half its length): what :func:`check_model` runs the model on."""
        sequences = {name: Sequence(torch.zeros(batch, length, self.width_of(name),
                                                dtype=dtype),
                                    torch.full((batch,), max(length // 2, 1)))
                     for name, length in self.sequences}
        widths = [self.width_of(n) for n in self.pooled]
        pooled: torch.Tensor | tuple[torch.Tensor, ...]
        if len(set(widths)) > 1:
            pooled = tuple(torch.zeros(batch, w, dtype=dtype) for w in widths)
        else:
            pooled = torch.zeros(batch, len(self.pooled), widths[0] if widths else
                                 self.config.row_dim, dtype=dtype)
        return Features(self.pooled, pooled, torch.zeros(batch, self.n_dense, dtype=dtype),
                        sequences)


def resolve_factory(name: str) -> Callable[[ModelSpec], nn.Module]:
    """The factory ``--model`` names: a built-in, or ``package.module:function``.

    Raises:
        ModelError: No such built-in, module or function (one line).
    """
    from hetgmp.trainer.model.zoo import BUILTINS

    path = BUILTINS.get(name, name)
    if ":" not in path:
        raise ModelError(f"model {name!r}: a built-in ({', '.join(BUILTINS)}) or "
                         "package.module:function")
    module_name, _, attr = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ModelError(f"model {name!r}: cannot import {module_name!r} ({exc})") from None
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise ModelError(f"model {name!r}: {module_name!r} has no function {attr!r}")
    return factory  # type: ignore[no-any-return]


def build_model(config: ModelConfig, n_fields: int, n_dense: int,
                spec: ModelSpec | None = None) -> nn.Module:
    """The configured model with parameters drawn from ``config.seed`` (same on every rank),
    in ``config.dtype``.

    Args:
        config: The model settings; ``config.model`` names the factory.
        n_fields: Pooled fields (when no ``spec`` is given).
        n_dense: Dense features (idem).
        spec: What the factory is given (default: ``n_fields`` pooled fields, no sequence).

    The global RNG is left as it was: initialisation uses a forked RNG state.
    """
    spec = spec or ModelSpec.of_fields(config, n_fields, n_dense)
    factory = resolve_factory(config.model)
    dtype = torch.float64 if config.dtype == "float64" else torch.float32
    # The global RNG is one per process: ranks that are threads of one process (the fast lane,
    # trainer.dist.ThreadComm) must not interleave their seeding and drawing.
    with _SEEDING, torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        model = factory(spec)
    if not isinstance(model, nn.Module):
        raise ModelError(f"model {config.model!r}: the factory returned "
                         f"{type(model).__name__}, not a torch.nn.Module")
    return model.to(dtype)


def check_model(model: nn.Module, spec: ModelSpec) -> None:
    """Run ``model`` once on a small batch shaped as ``spec`` says, without gradients, so that
    a model that reads a field the schema does not have, or returns the wrong shape, is
    refused before any rank starts.

    Raises:
        ModelError: One line naming the model and what went wrong.
    """
    name = spec.config.model
    dtype = next((p.dtype for p in model.parameters()), torch.float32)
    try:
        with torch.no_grad():
            out = model(spec.example(3, dtype))
    except KeyError as exc:
        raise ModelError(f"model {name!r} reads a field this schema does not give it: "
                         f"{exc.args[0] if exc.args else exc}") from None
    except Exception as exc:  # any failure of the user's code, said in one line
        raise ModelError(f"model {name!r} failed on a batch of this schema: "
                         f"{type(exc).__name__}: {exc}") from None
    want = {(3,), (3, 1)} if spec.tasks == 1 else {(3, spec.tasks)}
    if not isinstance(out, torch.Tensor) or tuple(out.shape) not in want:
        got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise ModelError(f"model {name!r} returned {got} for 3 records; it must return "
                         f"logits of shape {' or '.join(str(w) for w in sorted(want))}")
