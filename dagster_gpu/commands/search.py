"""``dagster-gpu search``: embed a query with the index's own model and options, print the nearest rows.

    dagster-gpu search -m pipelines.definitions -a fortune_embeddings_index "text" [-k 10]
            [--fingerprint fp1-…] [--model DIR_OR_ID] [--device cpu] [--exact] [-w workspace.yaml] [--json]

``-a`` names the index asset (:func:`dagster_gpu.definitions.vector_index.vector_index_asset`) or the embedding asset it
follows. The query is embedded as the rows were: the fingerprint's lineage (recorded from the outputs'
parquet metadata) gives the model, its revision, ``max_seq_length``, ``normalize``, ``truncate_dim`` and
``output_dtype``; the prompt is the model's ``"query"`` prompt (``prompts.query_prompt``: what
``SentenceTransformer.encode_query`` applies), not the documents' prompt. An index holding rows of
several fingerprints is refused unless ``--fingerprint`` picks one (vectors of two models or prompts are
not comparable). Exit 2 on a usage error (message on stderr), 0 otherwise.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from typing import Any, Mapping

from dagster_gpu.commands.code_module import add_workspace_argument, load_definitions
from dagster_gpu.commands.common import console
from dagster_gpu.definitions.partitions import index_behind
from dagster_gpu.definitions.vector_index import META_EMBEDDINGS, META_TABLE, META_URI
from dagster_gpu.embedding.encoder import Encoder
from dagster_gpu.embedding.model import ModelNotFound, load_model
from dagster_gpu.embedding.prompts import query_prompt
from dagster_gpu.index.lance import VectorIndex
from dagster_gpu.instance.events import metadata_values


class SearchError(Exception):
    """A query that cannot run as asked (message for the user)."""


@dataclass(frozen=True)
class QueryOptions:
    """How to embed a query for one fingerprint's rows (from its lineage)."""

    model: str
    revision: str | None  # LoadedModel.revision of the rows' model: a Hub commit or "sha256:<16 hex>" of its files
    max_seq_length: int | None
    normalize: bool
    truncate_dim: int | None
    output_dtype: str


def choose_fingerprint(found: Mapping[str, Mapping], wanted: str | None, where: str) -> str:
    """The fingerprint to query: ``wanted`` if the index holds it, else the only one. Raises SearchError naming
    ``where`` and each fingerprint with its rows when there are none, several (and ``wanted`` is None), or
    ``wanted`` is not among them."""
    listing = ", ".join(f"{fp or '(none)'} ({v['rows']} rows)" for fp, v in sorted(found.items()))
    if not found:
        raise SearchError(f"{where} holds no rows: materialize the index asset first")
    if wanted is not None:
        if wanted not in found:
            raise SearchError(f"{where} holds no rows of fingerprint {wanted!r}; it holds {listing}")
        return wanted
    if len(found) > 1:
        raise SearchError(f"{where} holds rows of {len(found)} fingerprints ({listing}): their vectors are not "
                          "comparable; pass --fingerprint to say which to search")
    return next(iter(found))


def query_options(lineage: Mapping[str, Any], model_override: str | None = None) -> QueryOptions:
    """The query's model and options from a fingerprint's lineage (``model``, ``model_revision``,
    ``max_seq_length``, ``normalize``, ``truncate_dim``, ``output_dtype``); ``model_override`` (``--model``)
    replaces the model. Raises SearchError when neither names a model."""
    model = model_override or lineage.get("model")
    if not model:
        raise SearchError("the index's rows carry no model in their lineage (outputs written without "
                          "dagster_gpu.* parquet metadata): pass --model with the embedding asset's model")
    td = lineage.get("truncate_dim")
    msl = lineage.get("max_seq_length")
    return QueryOptions(model=str(model), revision=lineage.get("model_revision") or None,
                        max_seq_length=int(msl) if msl else None, normalize=bool(lineage.get("normalize", True)),
                        truncate_dim=int(td) if td else None, output_dtype=str(lineage.get("output_dtype") or "float32"))


def embed_query(text: str, opts: QueryOptions, device: str = "cpu"):
    """``(vector [dim] float32, prompt)``: ``text`` embedded with the model's query prompt by the same
    :class:`dagster_gpu.embedding.encoder.Encoder` the embedding asset uses, the model loaded at the rows'
    Hub revision (a model directory: its files' ``sha256:`` revision must match). Raises ModelNotFound,
    SearchError when the weights found are not the rows' revision."""
    import numpy as np

    hub_revision = opts.revision if opts.revision and not opts.revision.startswith("sha256:") else None
    loaded = load_model(opts.model, device=device, max_seq_length=opts.max_seq_length, revision=hub_revision)
    found = getattr(loaded, "revision", None)
    if opts.revision and found and found != opts.revision:
        raise SearchError(f"model {opts.model!r} here is revision {found}, the rows were embedded with {opts.revision}: "
                          "their vectors are not comparable (re-embed, or give --model the original weights)")
    prompt = query_prompt(loaded.model)
    kw: dict[str, Any] = {"normalize": opts.normalize, "prompt": prompt}
    if opts.truncate_dim:
        kw["truncate_dim"] = opts.truncate_dim
    enc = Encoder(loaded.model, 8, **kw)
    try:
        vec = np.asarray(enc.encode([text]).vectors[0], dtype=np.float32)
    finally:
        close = getattr(enc, "close", None)
        if close:
            close()
    return vec, prompt


def index_of(defs, asset: str):
    """``(VectorIndex, index asset key, embeddings asset key string)`` for ``-a``; SearchError when it is neither
    an index asset nor an embedding asset with one."""
    import dagster as dg

    key = dg.AssetKey.from_user_string(asset)
    keys = defs.resolve_all_asset_keys()
    if key not in keys:
        raise SearchError(f"no asset {asset!r} (assets: {', '.join(sorted(k.to_user_string() for k in keys))})")

    # every asset's metadata from the asset graph (get_assets_def warns for an AssetSpec such as the corpus)
    metas = {k: metadata_values(a.metadata_by_key.get(k, {}))
             for a in defs.resolve_asset_graph().assets_defs for k in a.keys}
    meta = lambda k: metas.get(k, {})  # noqa: E731

    md = meta(key)
    if META_URI not in md:
        found = [k for k in keys if meta(k).get(META_EMBEDDINGS) == key.to_user_string()]
        if len(found) != 1:
            raise SearchError(f"{asset} is not an index asset and {len(found)} index assets follow it "
                              f"({', '.join(k.to_user_string() for k in found)}): name the index asset")
        key, md = found[0], meta(found[0])
    return VectorIndex(md[META_URI], md[META_TABLE]), key, md.get(META_EMBEDDINGS)


def lacking_partitions(materialized, indexed, loaded=()) -> list[str]:
    """The ``materialized`` partition keys (the embeddings', in their order) that ``indexed`` (the keys with rows
    in the table) lacks, but for those in ``loaded``: partitions the index asset materialized after their latest
    embeddings materialization (one with 0 rows, e.g. an empty file's, has nothing to put in the table). Pure."""
    have = set(indexed) | set(loaded)
    return [k for k in materialized if k not in have]


def coverage_warning(defs, key, emb: str | None, index, module: str) -> str | None:
    """A sentence naming how many of the embeddings' materialized (and still registered) partitions the index
    lacks (:func:`lacking_partitions`: one the index asset loaded with 0 rows is not lacking), a few of them, and
    how to fix it; None when it lacks none, or when $DAGSTER_HOME's instance cannot be
    opened (nothing known to compare with)."""
    import dagster as dg

    if not emb:
        return None
    try:
        instance = dg.DagsterInstance.get()
    except Exception:  # noqa: BLE001 - no instance here: search answers without the comparison
        return None
    emb_key = dg.AssetKey.from_user_string(emb)
    pdef = defs.get_assets_def(emb_key).partitions_def
    registered = instance.get_dynamic_partitions(pdef.name) if isinstance(pdef, dg.DynamicPartitionsDefinition) else []
    done = instance.get_latest_storage_id_by_partition(emb_key, dg.DagsterEventType.ASSET_MATERIALIZATION)
    materialized = [k for k in registered if k in done]
    loads = instance.get_latest_storage_id_by_partition(key, dg.DagsterEventType.ASSET_MATERIALIZATION)
    lacking = lacking_partitions(materialized, index.partition_keys(),
                                 [k for k in loads if not index_behind(k, done, loads)])
    if not lacking:
        return None
    ix = key.to_user_string()
    return (f"the index lacks {len(lacking)} of the {len(materialized)} materialized partitions of {emb} "
            f"({', '.join(lacking[:3])}{', …' if len(lacking) > 3 else ''}): these results leave them out. "
            f"Why: dagster-gpu stale -m {module} -a {ix}; load them: dagster-gpu backfill -m {module} -a {ix} --stale "
            f"(or rebuild the table: dagster-gpu index -m {module} -a {ix} --rebuild)")


#: Index columns that are bookkeeping, not content: never shown by ``search`` (the vector, hashes, token counts,
#: the index's own row number and fingerprint, the record id behind doc_id, LanceDB's distance).
HIDDEN_COLUMNS = frozenset({"vector", "_distance", "record_id", "token_count", "text_sha256", "record_sha256",
                            "index_row", "fingerprint", "doc_id", "partition_key", "chunk_index", "char_start", "char_end"})
TEXT_COLUMN = "text"
#: Characters of a row's text in the table (``--json`` prints it whole).
TEXT_LIMIT = 200


def shown_columns(column_names) -> list[str]:
    """The content columns of a search result: ``text`` first (when the embedding asset kept it,
    ``include_text=True``), then the carried columns (``TextFormat.carry_columns``) in the table's order."""
    rest = [c for c in column_names if c not in HIDDEN_COLUMNS]
    return ([TEXT_COLUMN] if TEXT_COLUMN in rest else []) + [c for c in rest if c != TEXT_COLUMN]


def _plain(v):
    """A JSON-able value (dates and other Arrow scalars as their ISO/str form)."""
    return v if v is None or isinstance(v, (str, int, float, bool, list, dict)) else str(v)


def _cell(v, limit: int) -> str:
    text = "" if v is None else str(v).replace("\n", " ")
    return text if len(text) <= limit else text[:limit - 1] + "…"


def search_main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="dagster-gpu search", description="nearest rows of a vector index asset")
    ap.add_argument("-m", "--module", required=True, help="module holding the Definitions (e.g. pipelines.definitions)")
    ap.add_argument("--attribute", default="defs")
    add_workspace_argument(ap)
    ap.add_argument("-a", "--asset", required=True, help="the index asset (or the embedding asset it follows), '/'-separated")
    ap.add_argument("query", help="query text")
    ap.add_argument("-k", type=int, default=10, help="rows to return (default 10)")
    ap.add_argument("--fingerprint", default=None, help="which fingerprint's rows to search (required when several)")
    ap.add_argument("--model", default=None, help="model to embed the query with when the rows' lineage names none")
    ap.add_argument("--device", default="cpu", help="device for the query's embedding (default cpu)")
    ap.add_argument("--exact", action="store_true", help="exact (flat) search, bypassing the ANN index")
    ap.add_argument("--json", action="store_true", help="print JSON lines instead of a table")
    args = ap.parse_args(argv)
    if args.k < 1:
        ap.error("-k must be at least 1")

    loaded = load_definitions(args.module, args.attribute, "dagster-gpu search", args.workspace)
    if loaded is None:
        return 2
    _, defs = loaded
    try:
        index, key, emb = index_of(defs, args.asset)
        where = f"index {key.to_user_string()} ({index.uri}, table {index.table_name!r})"
        found = index.fingerprints()
        fp = choose_fingerprint(found, args.fingerprint, where)
        opts = query_options(found[fp]["lineage"], args.model)
        vec, prompt = embed_query(args.query, opts, args.device)
        cols = ["doc_id", "partition_key", "chunk_index", "char_start", "char_end", "fingerprint"]
        res = index.search(vec, args.k, fingerprint=fp if len(found) > 1 else None, exact=args.exact)
    except (SearchError, ModelNotFound, LookupError) as e:
        print(f"dagster-gpu search: {e}", file=sys.stderr)
        return 2
    warning = coverage_warning(defs, key, emb, index, args.module)
    if warning:
        print(f"dagster-gpu search: warning: {warning}", file=sys.stderr)
    have = [c for c in cols if c in res.column_names]
    shown = shown_columns(res.column_names)  # the text (include_text) and the carried columns
    rows = [{**{c: r[c] for c in have}, **{c: _plain(r[c]) for c in shown}, "distance": float(r["_distance"])}
            for r in res.to_pylist()]
    if args.json:
        for r in rows:
            print(json.dumps(r))
        return 0
    from rich.table import Table

    t = Table(title=f"{len(rows)} nearest rows of {key.to_user_string()} (fingerprint {fp or '(none)'}, "
                    f"model {opts.model}, query prompt {prompt!r})")
    for c in ("doc_id", "partition", "chunk", "chars", *shown, "distance"):
        t.add_column(c, justify="right" if c in ("chunk", "distance") else "left",
                     overflow="fold" if c == TEXT_COLUMN else "ellipsis")
    for r in rows:
        t.add_row(str(r.get("doc_id", "")), str(r.get("partition_key", "")), str(r.get("chunk_index", "")),
                  f"{r.get('char_start', '')}-{r.get('char_end', '')}",
                  *(_cell(r[c], TEXT_LIMIT if c == TEXT_COLUMN else 40) for c in shown), f"{r['distance']:.4f}")
    console().print(t)
    return 0
