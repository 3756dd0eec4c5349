"""Partition keys derived from corpus file names (dagster_gpu.core.partition_keys)."""

from __future__ import annotations

import hashlib
import re

import pytest

from dagster_gpu.core.partition_keys import MAX_KEY_LENGTH, PartitionKeyError, partition_key_for, validate_partition_key

# Kubernetes label value syntax ("Labels and Selectors"): <= 63 chars, [A-Za-z0-9._-], alphanumeric at both ends.
K8S_LABEL_VALUE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?$")


def h8(name: str) -> str:
    return hashlib.sha256(name.encode("utf-8")).hexdigest()[:8]


@pytest.mark.parametrize("name", ["computers", "linux", "fortunes.parquet", "a-b_c.d", "x" * 63, "A1"])
def test_plain_names_are_kept(name):
    assert partition_key_for(name) == name
    assert validate_partition_key(name) == name


WEIRD = {
    "my file.txt": f"my_file.txt-{h8('my file.txt')}",
    "it's \"quoted\"": f"it_s_quoted-{h8('it' + chr(39) + 's ' + chr(34) + 'quoted' + chr(34))}",
    "$(rm -rf /)": f"rm_-rf-{h8('$(rm -rf /)')}",
    "日本語.txt": f"txt-{h8('日本語.txt')}",
    "日本語": f"file-{h8('日本語')}",
    "$(…)": f"file-{h8('$(…)')}",
    "line\nbreak": f"line_break-{h8('line' + chr(10) + 'break')}",
    ".hidden": f"hidden-{h8('.hidden')}",
    "a b/c d": f"a_b__c_d-{h8('a b/c d')}",
}


@pytest.mark.parametrize("name,expected", sorted(WEIRD.items()))
def test_unsafe_names_are_encoded_with_a_hash(name, expected):
    key = partition_key_for(name)
    assert key == expected
    assert K8S_LABEL_VALUE.match(key), key
    assert validate_partition_key(key) == key


def test_nested_paths_join_with_double_underscore():
    assert partition_key_for("sub/dir/file.txt") == "sub__dir__file.txt"
    assert partition_key_for("2024/01/part-0001.parquet") == "2024__01__part-0001.parquet"


def test_long_names_are_cut_to_54_plus_hash():
    name = "x" * 70  # safe characters but longer than 63
    key = partition_key_for(name)
    assert key == "x" * 54 + "-" + h8(name)
    assert len(key) == MAX_KEY_LENGTH == 63
    # 64 characters is one too many
    assert partition_key_for("y" * 64) == "y" * 54 + "-" + h8("y" * 64)
    # a long unsafe name: cut after cleaning, trailing separators removed before the hash
    long_unsafe = "report " * 20 + ".txt"
    key = partition_key_for(long_unsafe)
    assert K8S_LABEL_VALUE.match(key) and len(key) <= 63
    assert key.endswith("-" + h8(long_unsafe))
    head = key[: -9]
    assert head == ("report_" * 8)[:54].rstrip("_")  # 54 chars of the cleaned name, edges stripped


def test_long_names_sharing_a_prefix_get_distinct_keys():
    a, b = "p" * 80 + "a", "p" * 80 + "b"
    assert partition_key_for(a) != partition_key_for(b)
    assert partition_key_for(a)[:54] == partition_key_for(b)[:54]


def test_keys_are_stable():
    names = list(WEIRD) + ["computers", "x" * 100, "sub/dir/f"]
    first = [partition_key_for(n) for n in names]
    second = [partition_key_for(n) for n in names]
    assert first == second


def test_distinct_names_get_distinct_keys():
    names = [
        "my file", "my_file", "my  file", "my\tfile", "my\nfile", "my'file", 'my"file',
        "a/b", "a__b", "a_/b", "a/_b", "a/b/c", "a__b/c", "a/b__c",
        "日本語", "中文", "日本語.txt", "$(rm -rf /)", "$(reboot)", ".x", "x", "-x", "x-",
    ]
    keys = [partition_key_for(n) for n in names]
    assert len(set(keys)) == len(names), [k for k in keys if keys.count(k) > 1]
    for k in keys:
        assert K8S_LABEL_VALUE.match(k), k


def test_nested_path_and_flat_name_with_double_underscore_do_not_collide():
    # a/b is joined as a__b; a file literally named a__b must not take the same key
    assert partition_key_for("a/b") == "a__b"
    assert partition_key_for("a__b") == f"a__b-{h8('a__b')}"
    assert partition_key_for("a_/b") == f"a___b-{h8('a_/b')}"


@pytest.mark.parametrize(
    "bad",
    ["", "-x", "x-", ".x", "x.", "_x", "a b", "a/b", "a$b", "日本", "a\nb", "x" * 64, None, 12],
)
def test_validate_partition_key_rejects(bad):
    with pytest.raises(PartitionKeyError) as e:
        validate_partition_key(bad)
    assert repr(bad) in str(e.value)


def test_validate_partition_key_accepts_limits():
    assert validate_partition_key("a") == "a"
    assert validate_partition_key("a" * 63) == "a" * 63
    assert validate_partition_key("a.b-c_d") == "a.b-c_d"
