"""embed_partition with the real packaged model (all-MiniLM-L6-v2) on CPU."""

from __future__ import annotations

import hashlib

import numpy as np
import pyarrow.parquet as pq
import pytest

from dagster_gpu.corpus.readers import CorpusReadError, TextFormat
from dagster_gpu.embedding.model import load_model
from dagster_gpu.embedding.pipeline import embed_partition
from dagster_gpu.embedding.spec import EmbeddingSpec
from dagster_gpu.embedding.writer import output_schema

FORTUNE = TextFormat(format="text", record_separator_line="%")

# ordinal: text (None = a record that is skipped)
RECORDS = [
    "A penny saved is a penny earned.",
    "",  # 1: empty
    "Two lines\n  of wisdom from the terminal.",
    "   ",  # 3: whitespace only
    " ".join(["word"] * 300),  # 4: 300 word tokens + [CLS]/[SEP] = 302 > 256: truncated
    " ".join(["word"] * 254),  # 5: 254 + 2 = 256 tokens: exactly the limit, not truncated
    " ".join(["word"] * 255),  # 6: 257 tokens: truncated
    "Café, naïve, 日本語のテキスト.",
    "Last one.",
]
KEPT_IDS = [0, 2, 4, 5, 6, 7, 8]
KEPT_TEXTS = [RECORDS[i] for i in KEPT_IDS]


def fortune_file(path, records):
    path.write_text("".join(f"{r}\n%\n" for r in records), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def model():
    return load_model("all-MiniLM-L6-v2", device="cpu")


def read_vectors(path, dim):
    t = pq.read_table(path)
    vec = np.asarray(t.column("vector").combine_chunks().flatten().to_numpy(), dtype=np.float32).reshape(-1, dim)
    return t, vec


def test_model_facts(model):
    assert (model.dim, model.device, model.max_seq_length) == (384, "cpu", 256)
    # the truncation expectations above depend on 'word' being one WordPiece token
    assert model.model.tokenizer.tokenize("word word") == ["word", "word"]


def test_embed_fortune_file(tmp_path, model):
    src = fortune_file(tmp_path / "fortunes", RECORDS)
    out = tmp_path / "out" / "fortunes.parquet"
    progress = []
    res = embed_partition(
        str(src), str(out), model, FORTUNE, spec=EmbeddingSpec(batch_size=2), read_batch_rows=3, on_batch=progress.append
    )
    assert res.rows == 7
    assert res.records == 9
    assert res.skipped_empty_rows == 2
    assert res.truncated_rows == 2
    assert res.dim == 384
    assert res.output_uri == str(out)
    assert res.seconds > 0 and res.texts_per_second == pytest.approx(7 / res.seconds)
    assert progress == [3, 6, 7]  # kept records per I/O batch of 3, cumulative

    t, vec = read_vectors(out, 384)
    assert t.schema.equals(output_schema(384))
    assert t.column("record_id").to_pylist() == KEPT_IDS
    spans = list(zip(t.column("char_start").to_pylist(), t.column("char_end").to_pylist()))
    assert t.column("text_sha256").to_pylist() == [
        hashlib.sha256(x[a:b].encode("utf-8")).hexdigest() for x, (a, b) in zip(KEPT_TEXTS, spans)]
    # records within max_seq_length are hashed whole; a truncated one up to where the tokenizer cut it
    assert [spans[i] for i in (0, 1, 3, 5, 6)] == [(0, len(KEPT_TEXTS[i])) for i in (0, 1, 3, 5, 6)]
    assert t.column("doc_id").to_pylist() == [f"fortunes/{i}" for i in KEPT_IDS]
    assert t.column("chunk_index").to_pylist() == [0] * 7

    direct = model.model.encode(KEPT_TEXTS, normalize_embeddings=True, convert_to_numpy=True)
    cos = np.sum(vec * direct, axis=1) / (np.linalg.norm(vec, axis=1) * np.linalg.norm(direct, axis=1))
    assert cos.shape == (7,)
    assert float(cos.min()) >= 0.999
    np.testing.assert_allclose(np.linalg.norm(vec, axis=1), 1.0, atol=1e-5)


def test_truncated_rows_match_the_tokenizer(model):
    tok = model.model.tokenizer
    lengths = [len(tok(t, add_special_tokens=True)["input_ids"]) for t in KEPT_TEXTS]
    assert lengths[2:5] == [302, 256, 257]
    assert sum(n > model.max_seq_length for n in lengths) == 2


def test_empty_file_gives_an_empty_valid_parquet(tmp_path, model):
    src = tmp_path / "empty"
    src.write_bytes(b"")
    out = tmp_path / "empty.parquet"
    res = embed_partition(str(src), str(out), model, FORTUNE)
    assert (res.rows, res.records, res.skipped_empty_rows, res.truncated_rows) == (0, 0, 0, 0)
    assert res.texts_per_second == 0.0
    t = pq.read_table(out)
    assert t.num_rows == 0 and t.schema.equals(output_schema(384))


def test_only_blank_records_gives_zero_rows(tmp_path, model):
    src = fortune_file(tmp_path / "blank records", ["", "  ", "\t"])
    out = tmp_path / "blank.parquet"
    res = embed_partition(str(src), str(out), model, FORTUNE)
    assert (res.rows, res.records, res.skipped_empty_rows) == (0, 3, 3)
    assert pq.read_table(out).num_rows == 0


def test_bad_utf8_raises_and_keeps_earlier_output(tmp_path, model):
    out = tmp_path / "part.parquet"
    good = fortune_file(tmp_path / "good", ["hello world"])
    embed_partition(str(good), str(out), model, FORTUNE)
    before = out.read_bytes()

    bad = tmp_path / "latin1"
    bad.write_bytes(b"fine record\n%\n" + "caf\u00e9\n%\n".encode("latin-1"))
    with pytest.raises(CorpusReadError) as e:
        embed_partition(str(bad), str(out), model, FORTUNE, read_batch_rows=1)
    assert str(bad) in str(e.value)
    assert out.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["good", "latin1", "part.parquet"]


def test_bad_utf8_with_no_earlier_output_leaves_nothing(tmp_path, model):
    bad = tmp_path / "latin1"
    bad.write_bytes("\u00e9t\u00e9\n".encode("latin-1"))
    out = tmp_path / "out" / "latin1.parquet"
    with pytest.raises(CorpusReadError):
        embed_partition(str(bad), str(out), model, TextFormat(format="text"))
    assert not out.exists()
    assert not out.parent.exists() or list(out.parent.iterdir()) == []


def test_one_encoder_and_prefetched_sources_across_partitions(tmp_path, model):
    """A worker's loop: one Encoder for every partition, the next file read while the current one encodes."""
    import torch

    from dagster_gpu.corpus.prefetch import BatchPrefetcher
    from dagster_gpu.embedding.cpus import CpuAllotment, CpuShare
    from dagster_gpu.embedding.encoder import Encoder

    files = [fortune_file(tmp_path / "a", RECORDS), fortune_file(tmp_path / "b", list(reversed(RECORDS)))]
    before = torch.get_num_threads()
    share = CpuShare(CpuAllotment(1, "test"), directory=tmp_path / "share")
    results = []
    try:
        with Encoder(model.model, 4, tokenizer_threads=2, cpu_share=share) as enc:
            nxt = BatchPrefetcher(str(files[0]), FORTUNE, read_batch_rows=3).start()
            for i, f in enumerate(files):
                cur = nxt
                if i + 1 < len(files):
                    nxt = BatchPrefetcher(str(files[i + 1]), FORTUNE, read_batch_rows=3).start()
                results.append(embed_partition(cur, str(tmp_path / f"{f.name}.parquet"), model, encoder=enc))
            pool_threads = {t for t in enc._pool._threads}
            assert len(pool_threads) <= 2
    finally:
        share.close()
        torch.set_num_threads(before)
    for r in results:
        assert (r.rows, r.records, r.skipped_empty_rows, r.truncated_rows) == (7, 9, 2, 2)
        assert (r.dtype, r.batch_size_initial, r.batch_size_final, r.oom_retries) == ("float32", 4, 4, 0)
        assert (r.tokenizer_threads, r.torch_threads, r.tokenization) == (2, 1, "fast")
    direct = model.model.encode(KEPT_TEXTS, normalize_embeddings=True, convert_to_numpy=True)
    _, va = read_vectors(tmp_path / "a.parquet", 384)
    tb, vb = read_vectors(tmp_path / "b.parquet", 384)
    assert tb.column("record_id").to_pylist() == [0, 1, 2, 3, 4, 6, 8]  # reversed file: blanks at 5 and 7
    for vec, expected in ((va, direct), (vb, direct[::-1])):
        cos = np.sum(vec * expected, axis=1) / (np.linalg.norm(vec, axis=1) * np.linalg.norm(expected, axis=1))
        assert float(cos.min()) >= 0.999


def test_a_uri_source_needs_its_text_format(tmp_path, model):
    with pytest.raises(ValueError, match="text_format is required"):
        embed_partition(str(tmp_path / "x"), str(tmp_path / "x.parquet"), model)


def test_cuda_oom_halves_the_batch_and_the_final_size_is_in_the_metadata(tmp_path, model):
    """64 records at the model's token limit; the forward pass fails with CUDA out-of-memory above 16 x 256
    tokens (a small device, simulated on CPU by a forward pre-hook on the real model)."""
    import torch

    from dagster_gpu.telemetry.stats import summarize
    from dagster_gpu.billing.measured import measure
    from dagster_gpu.worker.metadata import build_metadata
    from test_metadata import PLACEMENT

    records = [f"{i} " + " ".join(["token"] * 300) for i in range(64)]
    src = fortune_file(tmp_path / "long records", records)

    def small_device(module, args):
        ids = args[0]["input_ids"]
        if ids.shape[0] * ids.shape[1] > 16 * 256:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 96.00 MiB (simulated)")

    hook = model.model.register_forward_pre_hook(small_device)
    try:
        res = embed_partition(str(src), str(tmp_path / "long.parquet"), model, FORTUNE, spec=EmbeddingSpec(batch_size=64))
    finally:
        hook.remove()
    assert (res.rows, res.truncated_rows) == (64, 64)
    assert (res.batch_size_initial, res.batch_size_final, res.oom_retries) == (64, 16, 2)
    md = build_metadata(result=res, model_name="all-MiniLM-L6-v2", model_device="cpu",
                        telemetry=summarize([], [], unavailable_reason="x"),
                        billing=measure({"cpu": 0.05}, 3.0, "cpu", None, 0), backend="local", placement=PLACEMENT)
    assert (md["embedding/batch_size_final"], md["embedding/dtype"]) == (16, "float32")
    _, vec = read_vectors(tmp_path / "long.parquet", 384)
    direct = model.model.encode(records, batch_size=16, normalize_embeddings=True, convert_to_numpy=True)
    cos = np.sum(vec * direct, axis=1) / (np.linalg.norm(vec, axis=1) * np.linalg.norm(direct, axis=1))
    assert float(cos.min()) >= 0.999
