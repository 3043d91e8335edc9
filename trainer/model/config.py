"""The CTR model's settings (``--model``, ``--embed-dim``, ...)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

__all__ = ['ModelConfig']


@dataclass(frozen=True)
class ModelConfig:
    """The CTR model: architecture, embedding dimension, layer sizes, float type."""

    model: str = field(
        default="deepfm", metadata={"help": "the model: a built-in (widedeep, deepfm, dcn, dcnv2 "
                                    "(low-rank cross layers), dlrm (MLPerf's), din (attention "
                                    "of a sequence field over a candidate)) or a factory of "
                                    "yours, package.module:function, taking a ModelSpec and "
                                    "returning a torch.nn.Module (docs/models.md)"}
    )
    embed_dim: int = field(default=16, metadata={"help": "embedding dimension (of every "
                                                 "table the schema and --table-dims leave "
                                                 "out)"})
    table_dims: str = field(
        default="", metadata={"help": "row widths of tables, TABLE=DIM,... (over the "
                              "schema's dim; a table is its fields' table, or the field's "
                              "name): rows are stored in blocks of the widths' greatest "
                              "common divisor (docs/models.md)"})
    hidden: tuple[int, ...] = field(
        default=(128, 64), metadata={"help": "hidden layer sizes of the deep part"}
    )
    cross_layers: int = field(default=2, metadata={"help": "cross layers of DCN and DCN-v2"})
    cross_rank: int = field(default=32, metadata={"help": "rank of DCN-v2's cross layers"})
    bottom: tuple[int, ...] = field(
        default=(64,), metadata={"help": "hidden layer sizes of DLRM's bottom MLP over the dense "
                                 "features (it ends in one vector of --embed-dim)"}
    )
    dtype: Literal["float32", "float64"] = field(
        default="float32", metadata={"help": "parameter and exchange float type"}
    )
    seed: int = field(default=0, metadata={"help": "seed of the dense parameters"})
    autocast: Literal["off", "bf16"] = field(
        default="off",
        metadata={"help": "bf16: the model's forward and backward in training under "
                  "torch.autocast(bfloat16) (rows, parameters and their updates stay float32; "
                  "needs --dtype float32)"},
    )

    compile: Literal["off", "on"] = field(
        default="off",
        metadata={"help": "on: the model's training forward and backward go through "
                  "torch.compile (Inductor; compiled once per rank at the first step, 9-20 s "
                  "on a CPU the first time and about 2 s once Inductor's on-disk cache has the "
                  "kernels; the batch dimension is dynamic, so uneven local batches do not "
                  "recompile); prediction stays eager"},
    )

    def __post_init__(self) -> None:
        from hetgmp.trainer.model.zoo import BUILTINS

        if self.model not in BUILTINS and ":" not in self.model:
            raise ValueError(f"model {self.model!r}: a built-in ({', '.join(BUILTINS)}) or "
                             "package.module:function")
        if self.embed_dim < 1 or self.cross_layers < 0 or self.cross_rank < 1 or \
                any(h < 1 for h in (*self.hidden, *self.bottom)):
            raise ValueError("embed_dim, cross_rank and hidden sizes must be positive, "
                             "cross_layers >= 0")
        self.dims_of_tables()
        if self.autocast == "bf16" and self.dtype != "float32":
            raise ValueError("autocast bf16 needs dtype float32 (float64 is for exact checks)")

    def dims_of_tables(self) -> dict[str, int]:
        """``--table-dims`` as ``{table: dim}``.

        Raises:
            ValueError: Not ``TABLE=DIM`` pairs of positive widths.
        """
        from hetgmp.streaming import MAX_DIM

        out: dict[str, int] = {}
        for item in (x.strip() for x in self.table_dims.split(",")):
            if not item:
                continue
            table, sep, dim = (x.strip() for x in item.rpartition("="))
            if not sep or not table or not dim.isdigit() or not 1 <= int(dim) <= MAX_DIM:
                raise ValueError(f"--table-dims {self.table_dims!r}: expected TABLE=DIM pairs "
                                 f"separated by commas, DIM from 1 to {MAX_DIM}, got {item!r}")
            out[table] = int(dim)
        return out

    @property
    def first_order(self) -> bool:
        """Whether rows carry a first-order (linear) weight in front of their vector, in the
        tables whose schema does not say (``first_order``).

        Wide&Deep's wide part and DeepFM's first-order term are per-id scalars; keeping them as
        column 0 of the same row means one lookup, one exchange and one optimizer per id.
        """
        return self.model in ("widedeep", "deepfm")

    @property
    def row_dim(self) -> int:
        """Width of a stored embedding row."""
        return self.embed_dim + (1 if self.first_order else 0)
