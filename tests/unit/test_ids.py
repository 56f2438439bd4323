"""The one id validator (``protocol.ids``): what enters as an app, shuffle or partition id."""

from __future__ import annotations

import pytest

from riffle_actors.protocol.errors import ProtocolError
from riffle_actors.protocol.ids import (
    MAX_APP_ID_CHARS,
    check_app_id,
    check_partition_id,
    check_shuffle_id,
    parse_id_dirname,
)


@pytest.mark.parametrize("app_id", ["application_1700000000000_0001_1700000000001", "a", "x" * MAX_APP_ID_CHARS,
                                    "app.1@host:7+a=b,c-d"])
def test_valid_app_ids_pass(app_id):
    assert check_app_id(app_id) == app_id


@pytest.mark.parametrize("app_id", ["", ".", "..", "a/b", "../x", "a\nb", "a\x00b", "x" * (MAX_APP_ID_CHARS + 1),
                                    "app\u00e9", "\uff41pp", "a b", 7, None])
def test_unsafe_app_ids_are_refused_naming_the_field(app_id):
    with pytest.raises(ProtocolError) as e:
        check_app_id(app_id)
    assert e.value.field == "appId"


@pytest.mark.parametrize("check", [check_shuffle_id, check_partition_id])
def test_int_ids_are_java_ints(check):
    assert check(0) == 0 and check((1 << 31) - 1) == (1 << 31) - 1
    for bad in (-1, 1 << 31, 1 << 64, True, "1", 1.0):
        with pytest.raises(ProtocolError):
            check(bad)


@pytest.mark.parametrize("name,expected", [("0", 0), ("7", 7), ("2147483647", 2147483647)])
def test_dirnames_of_ids(name, expected):
    assert parse_id_dirname(name) == expected


@pytest.mark.parametrize("name", ["\u00b2", "\u0663", "007", "-1", "+1", " 1", "1 ", "", "2147483648",
                                  "99999999999999999999", "1e3", "0x10"])
def test_foreign_dirnames_are_refused(name):
    with pytest.raises(ProtocolError):
        parse_id_dirname(name)
