"""fingerprint / config_fingerprint (pure) and pooling_description on the packaged MiniLM and a prompt copy."""

from __future__ import annotations

import hashlib
import json

import pytest
from sentence_transformers import SentenceTransformer

from dagster_gpu.embedding.chunking import TokenChunks
from dagster_gpu.embedding.fingerprint import config_fingerprint, fingerprint, pooling_description
from dagster_gpu.embedding.model import resolve_model_path
from prompt_models import make_prompt_model

BASE = dict(model_revision="sha256:0123456789abcdef", model="all-MiniLM-L6-v2", prompt="passage: ",
            pooling={"pooling_mode": "mean", "include_prompt": True}, normalize=True, truncate_dim=None,
            output_dtype="float32", max_seq_length=256, chunking=None)


def test_fingerprint_is_the_canonical_json_hash():
    fp = fingerprint(**BASE)
    blob = json.dumps({"v": 1, **BASE}, sort_keys=True, separators=(",", ":"))
    assert fp == "fp1-" + hashlib.sha256(blob.encode()).hexdigest()[:16]
    assert fingerprint(**dict(reversed(list(BASE.items())))) == fp  # argument order does not matter
    assert fingerprint(**{**BASE, "pooling": {"include_prompt": True, "pooling_mode": "mean"}}) == fp


@pytest.mark.parametrize("field,value", [
    ("model_revision", "abc123"), ("prompt", ""), ("pooling", {"pooling_mode": "mean", "include_prompt": False}),
    ("normalize", False), ("truncate_dim", 128), ("output_dtype", "float16"), ("max_seq_length", 128),
    ("chunking", {"max_tokens": 128, "overlap": 0, "boundary": "token"})])
def test_every_field_changes_the_fingerprint(field, value):
    assert fingerprint(**{**BASE, field: value}) != fingerprint(**BASE)


def test_chunking_as_spec_or_dict():
    spec = TokenChunks(max_tokens=128, overlap=16)
    assert fingerprint(**{**BASE, "chunking": spec}) == fingerprint(**{**BASE, "chunking": spec.describe()})
    a = config_fingerprint(model="org/name", revision="r1", chunking=spec)
    assert a.startswith("cfg1-") and len(a) == 21
    assert a == config_fingerprint(model="org/name", revision="r1", chunking=spec.describe())
    assert a != config_fingerprint(model="org/name", revision="r2", chunking=spec)
    assert config_fingerprint(model="m", prompt_name="query") != config_fingerprint(model="m", prompt="query: ")
    assert config_fingerprint(model="m") != config_fingerprint(model="m", normalize=False)


def test_pooling_description(tmp_path):
    st = SentenceTransformer(str(resolve_model_path("all-MiniLM-L6-v2")), device="cpu")
    assert pooling_description(st) == {"embedding_dimension": 384, "include_prompt": True, "pooling_mode": "mean",
                                       "normalize_module": True}
    ex = SentenceTransformer(str(make_prompt_model(tmp_path / "m", include_prompt=False)), device="cpu")
    assert pooling_description(ex)["include_prompt"] is False
    json.dumps(pooling_description(ex))


def test_output_columns_change_the_config_fingerprint_and_default_columns_keep_the_old_one():
    from dagster_gpu.embedding.fingerprint import DEFAULT_COLUMNS, changed_options, config_fields, output_columns

    base = config_fingerprint(model="m")  # an asset defined before columns were hashed
    assert config_fingerprint(model="m", columns=DEFAULT_COLUMNS) == base  # its outputs stay current
    carried = output_columns(carry_columns=["package"], id_column="id")
    assert carried == {"id_column": "id", "carry_columns": ["package"], "include_text": False}
    assert config_fingerprint(model="m", columns=carried) != base
    assert config_fingerprint(model="m", columns=output_columns(carry_columns=["package"])) != \
        config_fingerprint(model="m", columns=carried)  # the id column alone changes it too
    assert config_fingerprint(model="m", columns=output_columns(include_text=True)) != base
    # the change is named
    old, new = config_fields(model="m", columns=carried), config_fields(model="m", columns=DEFAULT_COLUMNS)
    assert changed_options(old, new) == [
        'columns {"carry_columns": ["package"], "id_column": "id", "include_text": false} → '
        '{"carry_columns": [], "id_column": null, "include_text": false}']


def test_changed_options_prints_chunking_keys_in_one_order_on_both_sides():
    from dagster_gpu.embedding.fingerprint import changed_options

    old = {"chunking": {"overlap": 0, "max_tokens": 256, "boundary": "token"}}
    new = {"chunking": {"boundary": "token", "max_tokens": 128, "overlap": 0}}
    assert changed_options(old, new) == ['chunking {"boundary": "token", "max_tokens": 256, "overlap": 0} → '
                                         '{"boundary": "token", "max_tokens": 128, "overlap": 0}']
