"""Re-embedding reuses the previous output's vectors of unchanged texts (real packaged all-MiniLM-L6-v2, CPU)."""

from __future__ import annotations

import hashlib

import numpy as np
import pyarrow.parquet as pq
import pytest

from dagster_gpu.corpus.readers import TextFormat
from dagster_gpu.embedding.chunking import TokenChunks
from dagster_gpu.embedding.model import load_model
from dagster_gpu.embedding.pipeline import embed_partition, make_encoder
from dagster_gpu.embedding.reuse import load_previous

FORTUNE = TextFormat(format="text", record_separator_line="%")
BASE = [
    "A penny saved is a penny earned.",
    "Two lines\n  of wisdom from the terminal.",
    "Café, naïve, 日本語のテキスト.",
    "The early bird gets the worm, the second mouse gets the cheese.",
    "Last one.",
    " ".join(["word"] * 300),  # 302 tokens > 256: truncated, never reused without chunking
]


@pytest.fixture(scope="module")
def model():
    return load_model("all-MiniLM-L6-v2", device="cpu")


def embed(tmp_path, model, name, records, out, *, fp="fp1-0000000000000001", chunking=None, reuse=True):
    """(result, output table, texts that reached the encoder)."""
    src = tmp_path / name
    src.write_text("".join(f"{r}\n%\n" for r in records), encoding="utf-8")
    enc = make_encoder(model.model, 4, chunking=chunking)
    seen: list[str] = []
    submit = enc._submit
    enc._submit = lambda texts: (seen.extend(texts), submit(texts))[1]
    try:
        res = embed_partition(str(src), str(out), model, FORTUNE, encoder=enc, partition_key="p", reuse=reuse,
                              lineage={"fingerprint": fp, "model": model.name, "model_revision": "r"})
    finally:
        enc.close()
    return res, pq.read_table(out), seen


def vectors(t):
    return np.asarray(t.column("vector").combine_chunks().flatten().to_numpy()).reshape(t.num_rows, -1)


def check_like_full(t, full, previous, reused_texts):
    """Every column but the vector equals the full embed's; reused rows' vectors are the previous output's bits,
    the others within cosine 0.9999 of the full embed."""
    cols = [c for c in full.column_names if c != "vector"]
    assert t.select(cols).to_pylist() == full.select(cols).to_pylist()
    v, vf, vp = vectors(t), vectors(full), vectors(previous)
    by_hash = {}
    for i, h in enumerate(previous.column("record_sha256" if "record_sha256" in cols else "text_sha256").to_pylist()):
        by_hash.setdefault(h, []).append(i)
    key = t.column("record_sha256" if "record_sha256" in cols else "text_sha256").to_pylist()
    chunk = t.column("chunk_index").to_pylist()
    reused = 0
    for i, (h, c) in enumerate(zip(key, chunk)):
        if h in reused_texts:
            assert v[i].tobytes() == vp[by_hash[h][c]].tobytes()
            reused += 1
        else:
            cos = float(v[i] @ vf[i] / np.linalg.norm(v[i]) / np.linalg.norm(vf[i]))
            assert cos >= 0.9999
    return reused


def sha(t):
    return hashlib.sha256(t.encode()).hexdigest()


def test_duplicates_reordering_insertions_deletions_edits(tmp_path, model):
    out = tmp_path / "out.parquet"
    res0, prev, seen0 = embed(tmp_path, model, "f", BASE, out)
    assert res0.reused_rows == 0 and seen0 == BASE
    new = [BASE[3], "Inserted record.", BASE[0], BASE[0], "Two lines\n  of wisdom from the TERMINAL.", BASE[5], BASE[2]]
    res, t, seen = embed(tmp_path, model, "f", new, out)
    # only new or changed texts (and the truncated one) reached the encoder; BASE[4] was deleted
    assert seen == ["Inserted record.", "Two lines\n  of wisdom from the TERMINAL.", BASE[5]]
    assert res.reused_rows == 4 and res.rows == 7 and res.records_embedded == 7
    assert res.rows_embedded == 3 and res.texts_per_second == pytest.approx(3 / res.seconds)  # not 7 / seconds
    _, full, _ = embed(tmp_path, model, "f", new, tmp_path / "full.parquet", reuse=False)
    assert check_like_full(t, full, prev, {sha(BASE[i]) for i in (0, 2, 3)}) == 4
    assert res.tokens == int(np.sum(full.column("token_count").to_numpy())) - int(
        np.sum(t.column("token_count").to_numpy()[[0, 2, 3, 6]]))


def test_unchanged_file_embeds_nothing(tmp_path, model):
    out = tmp_path / "out.parquet"
    _, prev, _ = embed(tmp_path, model, "f", BASE[:5], out)
    res, t, seen = embed(tmp_path, model, "f", BASE[:5], out)
    assert seen == [] and res.reused_rows == 5 and res.tokens == 0
    assert res.rows == 5 and res.rows_embedded == 0 and res.texts_per_second == 0.0  # no text reached the model
    assert vectors(t).tobytes() == vectors(prev).tobytes()
    assert t.drop(["vector"]).to_pylist() == prev.drop(["vector"]).to_pylist()


def test_changed_fingerprint_or_unreadable_output_reuses_nothing(tmp_path, model):
    out = tmp_path / "out.parquet"
    embed(tmp_path, model, "f", BASE[:3], out)
    res, _, seen = embed(tmp_path, model, "f", BASE[:3], out, fp="fp1-0000000000000002")
    assert seen == BASE[:3] and res.reused_rows == 0
    assert "fingerprint" in load_previous(str(out), "fp1-0000000000000003", chunked=False, max_seq_length=256,
                                          dim=384, output_dtype="float32").reason
    out.write_bytes(b"not parquet")
    res, t, seen = embed(tmp_path, model, "f", BASE[:3], out, fp="fp1-0000000000000002")
    assert seen == BASE[:3] and res.reused_rows == 0 and t.num_rows == 3
    res, _, seen = embed(tmp_path, model, "f", BASE[:3], out, fp="fp1-0000000000000002", reuse=False)
    assert seen == BASE[:3] and res.reused_rows == 0


def test_chunked_records_reused_whole(tmp_path, model):
    chunking = TokenChunks(max_tokens=24, overlap=4)
    long = [" ".join(f"{w}{i}" for i in range(40)) for w in ("alpha", "beta", "gamma")]
    out = tmp_path / "out.parquet"
    _, prev, _ = embed(tmp_path, model, "f", long, out, chunking=chunking)
    assert prev.column("record_sha256").to_pylist()[0] == sha(long[0])
    n_chunks = {h: prev.column("record_sha256").to_pylist().count(h) for h in map(sha, long)}
    assert min(n_chunks.values()) > 2
    changed = long[1].replace("beta20", "BETA20")
    new = [long[2], changed, long[0], long[0]]
    res, t, seen = embed(tmp_path, model, "f", new, out, chunking=chunking)
    assert seen == [changed]  # the changed record's every chunk, nothing of the others
    assert res.reused_rows == n_chunks[sha(long[2])] + 2 * n_chunks[sha(long[0])]
    _, full, _ = embed(tmp_path, model, "f", new, tmp_path / "full.parquet", chunking=chunking, reuse=False)
    assert check_like_full(t, full, prev, {sha(long[0]), sha(long[2])}) == res.reused_rows
    # an unchunked pass does not read chunk rows as whole records
    res, _, seen = embed(tmp_path, model, "f", new, out)
    assert res.reused_rows == 0


def test_asset_rematerialization_reports_reused_rows(tmp_path):
    """embedding_asset in process: the second materialization of an unchanged file embeds nothing and says so;
    reuse=False embeds it all again."""
    import dagster as dg
    from dagster import instance_for_test

    from dagster_gpu import CorpusSource, TokenChunks, embedding_asset

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "f.txt").write_text("".join(f"{r}\n%\n" for r in BASE[:5]), encoding="utf-8")

    def make(**kw):
        return embedding_asset(name="emb", corpus=CorpusSource(url=str(corpus), text_format=FORTUNE),
                               output_url=str(tmp_path / "out"), model="all-MiniLM-L6-v2", device="cpu",
                               chunking=TokenChunks(max_tokens=12), **kw)

    with instance_for_test() as instance:
        instance.add_dynamic_partitions("emb_files", ["f.txt"])

        def reused(asset):
            assert dg.materialize([asset], instance=instance, partition_key="f.txt").success
            mat = instance.fetch_materializations(
                dg.AssetRecordsFilter(asset_key=asset.key, asset_partitions=["f.txt"]), limit=1).records[0]
            md = {k: getattr(v, "value", v) for k, v in mat.asset_materialization.metadata.items()}
            return md["embedding/reused_rows"], md["embedding/chunks"], md["embedding/tokens"]

        first = reused(make())
        assert first[0] == 0 and first[1] > 5 and first[2] > 0
        assert reused(make()) == (first[1], first[1], 0)
        assert reused(make(reuse=False)) == first
