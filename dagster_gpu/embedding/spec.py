"""``EmbeddingSpec``: everything that decides the vectors and the columns of an embedding output, as one value.

Built once by ``embedding_asset`` and carried unchanged by the work unit (``UnitSpec.embedding``) to
:func:`dagster_gpu.embedding.pipeline.embed_partition`. JSON round trip: :meth:`EmbeddingSpec.to_json` /
:meth:`EmbeddingSpec.from_json` (``chunking`` as its three ``TokenChunks`` fields, ``carry_columns`` as a list).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any, Mapping

from dagster_gpu.embedding.chunking import TokenChunks
from dagster_gpu.embedding.prompts import resolve_prompt
from dagster_gpu.embedding.writer import vector_type


@dataclass(frozen=True)
class EmbeddingSpec:
    """What an embedding asset computes and writes.

    Model (loaded offline, see :func:`dagster_gpu.embedding.model.load_model`):
        model: a local sentence-transformers directory or ``all-MiniLM-L6-v2`` (packaged, offline).
        revision / cache_folder / trust_remote_code: a Hugging Face model id at a revision, resolved offline from
            ``cache_folder`` (else HF_HOME / HF_HUB_CACHE); remote code only when opted in.
        max_seq_length: tokens per text (None = the model's own).
        dtype: ``float16`` or ``bfloat16`` runs the model in reduced precision on CUDA (CPU always runs float32);
            None = float32.
        batch_size: texts per forward pass (the unit halves it after a CUDA out-of-memory error).

    Texts: ``prompt_name`` / ``prompt``: sentence-transformers' rule (``prompt`` beats ``prompt_name``, else the model's
    ``default_prompt_name``; :func:`dagster_gpu.embedding.prompts.resolve_prompt`). ``chunking``: ``TokenChunks``
    cuts each record into windows of the model's tokens, one output row each; None truncates each record at
    ``max_seq_length`` (counted).

    Vectors: ``normalize`` L2-normalizes them; ``truncate_dim`` keeps the first N dimensions (Matryoshka),
    renormalized when ``normalize``; ``output_dtype`` is the ``vector`` column's type (``float32`` | ``float16``).

    Columns (:mod:`dagster_gpu.embedding.writer`): ``id_column`` / ``carry_columns`` override the corpus's
    ``TextFormat`` (parquet and JSON Lines corpora: the corpus's own id as ``doc_id``, else
    ``<partition key>/<record_id>``; columns copied into each row unchanged); None keeps the corpus's.
    ``include_text`` keeps each row's text (its chunk) in a ``text`` column.

    Raises ValueError for ``truncate_dim`` < 1, ``batch_size`` < 1 or an unknown ``output_dtype`` (naming the choices).
    """

    model: str = "all-MiniLM-L6-v2"
    revision: str | None = None
    cache_folder: str | None = None
    trust_remote_code: bool = False
    max_seq_length: int | None = None
    dtype: str | None = None
    batch_size: int = 64
    prompt_name: str | None = None
    prompt: str | None = None
    chunking: TokenChunks | None = None
    normalize: bool = True
    truncate_dim: int | None = None
    output_dtype: str = "float32"
    id_column: str | None = None
    carry_columns: tuple[str, ...] | None = None
    include_text: bool = False

    def __post_init__(self):
        if self.carry_columns is not None and not isinstance(self.carry_columns, tuple):
            object.__setattr__(self, "carry_columns", tuple(self.carry_columns))
        vector_type(self.output_dtype)  # an unknown dtype fails here, naming the choices
        if self.truncate_dim is not None and int(self.truncate_dim) < 1:
            raise ValueError(f"EmbeddingSpec.truncate_dim must be >= 1, got {self.truncate_dim}")
        if int(self.batch_size) < 1:
            raise ValueError(f"EmbeddingSpec.batch_size must be >= 1, got {self.batch_size}")

    def fingerprint_options(self) -> dict[str, Any]:
        """The options known without loading the model that change a vector: the keyword arguments of
        :func:`dagster_gpu.embedding.fingerprint.config_fingerprint` and ``config_fields``."""
        return dict(model=self.model, revision=self.revision, prompt_name=self.prompt_name, prompt=self.prompt,
                    normalize=self.normalize, truncate_dim=self.truncate_dim, output_dtype=self.output_dtype,
                    max_seq_length=self.max_seq_length, chunking=self.chunking_description())

    def chunking_description(self) -> dict | None:
        """``chunking.describe()`` (what the fingerprint and the lineage record), None without chunking."""
        return self.chunking.describe() if self.chunking is not None else None

    def encoder_options(self) -> dict[str, Any]:
        """The :class:`dagster_gpu.embedding.encoder.Encoder` options this spec sets (the prompt text is the
        model's to resolve: :meth:`resolve_prompt`)."""
        return dict(normalize=self.normalize, truncate_dim=self.truncate_dim, output_dtype=self.output_dtype,
                    chunking=self.chunking)

    def load_options(self) -> dict[str, Any]:
        """Keyword arguments of :func:`dagster_gpu.embedding.model.load_model` besides the model and the device
        (``revision``, ``cache_folder``, ``trust_remote_code`` only when set)."""
        extra = {k: v for k, v in (("revision", self.revision), ("cache_folder", self.cache_folder),
                                    ("trust_remote_code", self.trust_remote_code)) if v}
        return dict(max_seq_length=self.max_seq_length, dtype=self.dtype, **extra)

    def resolve_prompt(self, st) -> tuple[str, str | None]:
        """(prompt text, prompt name or None) for the loaded SentenceTransformer ``st``
        (:func:`dagster_gpu.embedding.prompts.resolve_prompt`); ValueError for a name the model does not have."""
        return resolve_prompt(st, self.prompt_name, self.prompt)

    # -- JSON --------------------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """JSON-able fields: every field by name, ``chunking`` as ``{max_tokens, overlap, boundary}`` or None,
        ``carry_columns`` as a list or None."""
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        d["chunking"] = dataclasses.asdict(self.chunking) if self.chunking is not None else None
        d["carry_columns"] = list(self.carry_columns) if self.carry_columns is not None else None
        return d

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "EmbeddingSpec":
        """The spec :meth:`to_dict` wrote. Raises ValueError naming any key that is not a field (a spec written
        by a newer release) and the field checks' ValueError."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise ValueError(f"EmbeddingSpec: unknown field(s) {unknown}; the fields are {sorted(names)}")
        fields = dict(data)
        if fields.get("chunking") is not None:
            fields["chunking"] = TokenChunks(**fields["chunking"])
        return cls(**fields)

    def to_json(self) -> str:
        """:meth:`to_dict` as JSON, keys sorted (the same spec is the same text)."""
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "EmbeddingSpec":
        """The spec :meth:`to_json` wrote; ValueError for text that is not a JSON object of its fields."""
        data = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError(f"EmbeddingSpec.from_json: expected a JSON object, got {type(data).__name__}")
        return cls.from_dict(data)
