"""A large file is cut into shards by default (CorpusSource.shard_bytes's default, DEFAULT_SHARD_BYTES); None
turns it off; a file-grouped corpus has none."""

from __future__ import annotations

import pytest

from dagster_gpu import CorpusSource, TextFormat, embedding_asset
from dagster_gpu.core.request import TAG_SHARD_BYTES
from dagster_gpu.corpus.listing import DEFAULT_SHARD_BYTES

LINE = "a line of text that is one record\n"  # 34 bytes


def test_a_large_file_becomes_several_shards_by_default(tmp_path):
    d = tmp_path / "corpus"
    d.mkdir()
    lines = 300_000  # 10.2 MB: above 4 MiB
    (d / "big.txt").write_text(LINE * lines)
    (d / "small.txt").write_text(LINE * 10)
    corpus = CorpusSource(url=str(d), text_format=TextFormat(format="text"))
    assert corpus.shard_bytes == DEFAULT_SHARD_BYTES == 4 * 1024 * 1024
    files = corpus.list_files()
    big = [f for f in files if f.file_key == "big.txt"]
    assert [f.key for f in files if f.shard is None] == ["small.txt"]
    assert len(big) == 3 and [s.shard.count for s in big] == [3, 3, 3]
    # every record in exactly one shard, each shard about 4 MiB and cut after a line
    assert sum(s.shard.records for s in big) == lines
    assert [s.shard.first_record for s in big] == [0, big[0].shard.records, big[0].shard.records + big[1].shard.records]
    # a cut at the first line end at or after each multiple of 4 MiB (dagster_gpu.corpus.shards.plan_byte_shards)
    m = DEFAULT_SHARD_BYTES
    cut1, cut2 = -(-m // len(LINE)) * len(LINE), -(-2 * m // len(LINE)) * len(LINE)
    assert [(s.shard.start, s.shard.end) for s in big] == [(0, cut1), (cut1, cut2), (cut2, lines * len(LINE))]
    # the asset carries the threshold to its workers
    asset = embedding_asset(name="sd_default", corpus=corpus, output_url=str(tmp_path / "out"), device="cpu")
    assert asset.op.tags[TAG_SHARD_BYTES] == str(DEFAULT_SHARD_BYTES)
    # an explicit setting overrides it; None is off
    assert len([f for f in CorpusSource(url=str(d), shard_bytes=2 * DEFAULT_SHARD_BYTES).list_files()
                if f.file_key == "big.txt"]) == 2
    assert [f.key for f in CorpusSource(url=str(d), shard_bytes=None).list_files()] == ["big.txt", "small.txt"]


def test_a_file_grouped_corpus_has_no_default_shards_and_a_bad_setting_is_named(tmp_path):
    assert CorpusSource(url=str(tmp_path), group_buckets=8).shard_bytes is None
    with pytest.raises(ValueError, match=r"CorpusSource\('.*'\)\.shard_bytes must be an integer >= 1, None \(no shards\) "
                                         r"or 'default', got 'auto'"):
        CorpusSource(url=str(tmp_path), shard_bytes="auto")
