"""Block id layout: the spec §5.2 vector, validation, and bit-exact composition."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from riffle_actors.protocol.blockid import (
    RIFFLE_FALLBACK,
    SPARK_DEFAULT,
    UNIFFLE_DEFAULT,
    BlockIdLayout,
)
from riffle_actors.protocol.errors import ProtocolError


def test_spec_vector_decodes_in_the_spark_default_layout() -> None:
    layout = BlockIdLayout(21, 20, 22)
    block_id = 0x0000140000C00009
    assert layout.sequence_no(block_id) == 5
    assert layout.partition_id(block_id) == 3
    assert layout.task_attempt_id(block_id) == 9
    assert layout.get_block_id(5, 3, 9) == block_id


def test_named_layouts() -> None:
    assert tuple(SPARK_DEFAULT) == (21, 20, 22)
    assert UNIFFLE_DEFAULT.as_tuple() == (18, 24, 21)
    assert tuple(RIFFLE_FALLBACK) == (16, 24, 23)
    assert BlockIdLayout(*SPARK_DEFAULT) == SPARK_DEFAULT
    assert BlockIdLayout.from_proto_fields(21, 20, 22) == SPARK_DEFAULT
    assert hash(BlockIdLayout(21, 20, 22)) == hash(SPARK_DEFAULT)
    assert SPARK_DEFAULT != UNIFFLE_DEFAULT


def test_uniffle_default_layout_places_fields() -> None:
    # s=18, p=24, t=21: partition starts at bit 21, sequence at bit 45
    block_id = (7 << 45) | (0xABCDEF << 21) | 0x1FFFFF
    assert UNIFFLE_DEFAULT.get_block_id(7, 0xABCDEF, 0x1FFFFF) == block_id
    assert UNIFFLE_DEFAULT.partition_id(block_id) == 0xABCDEF
    assert UNIFFLE_DEFAULT.task_attempt_id(block_id) == 0x1FFFFF
    assert UNIFFLE_DEFAULT.sequence_no(block_id) == 7


@pytest.mark.parametrize(
    "bits, field",
    [
        ((0, 0, 0), "block_id_layout.sequence_no_bits"),  # a request that carries no layout
        ((21, 20, 21), "block_id_layout"),  # sums to 62
        ((22, 20, 22), "block_id_layout"),  # sums to 64
        ((32, 15, 16), "block_id_layout.sequence_no_bits"),
        ((1, 32, 30), "block_id_layout.partition_id_bits"),
        ((31, 31, 1), None),  # valid edge
        ((1, 31, 31), None),
        ((21, -20, 62), "block_id_layout.partition_id_bits"),
        ((21, 20, 22.0), "block_id_layout.task_attempt_id_bits"),
        ((True, 31, 31), "block_id_layout.sequence_no_bits"),
    ],
)
def test_invalid_layouts_are_rejected(bits: tuple, field: str | None) -> None:
    if field is None:
        assert sum(BlockIdLayout.from_proto_fields(*bits)) == 63
        return
    with pytest.raises(ProtocolError) as info:
        BlockIdLayout.from_proto_fields(*bits)
    assert info.value.field == field


def test_layout_is_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        SPARK_DEFAULT.partition_id_bits = 10  # type: ignore[misc]


def test_get_block_id_rejects_parts_that_do_not_fit() -> None:
    layout = SPARK_DEFAULT
    assert layout.max_partition_id == (1 << 20) - 1
    assert layout.max_task_attempt_id == (1 << 22) - 1
    assert layout.max_sequence_no == (1 << 21) - 1
    for args, field in [
        ((1 << 21, 0, 0), "sequence_no"),
        ((0, 1 << 20, 0), "partition_id"),
        ((0, 0, 1 << 22), "task_attempt_id"),
        ((-1, 0, 0), "sequence_no"),
    ]:
        with pytest.raises(ProtocolError) as info:
            layout.get_block_id(*args)
        assert info.value.field == field
    assert layout.get_block_id((1 << 21) - 1, (1 << 20) - 1, (1 << 22) - 1) == (1 << 63) - 1


layouts = st.tuples(st.integers(1, 31), st.integers(1, 31)).filter(lambda sp: 1 <= 63 - sp[0] - sp[1] <= 31)


@given(layouts, st.data())
def test_compose_and_split_round_trip(sp: tuple[int, int], data: st.DataObject) -> None:
    s, p = sp
    layout = BlockIdLayout(s, p, 63 - s - p)
    seq = data.draw(st.integers(0, layout.max_sequence_no))
    partition = data.draw(st.integers(0, layout.max_partition_id))
    task = data.draw(st.integers(0, layout.max_task_attempt_id))
    block_id = layout.get_block_id(seq, partition, task)
    assert 0 <= block_id < 1 << 63
    assert (
        layout.sequence_no(block_id),
        layout.partition_id(block_id),
        layout.task_attempt_id(block_id),
    ) == (
        seq,
        partition,
        task,
    )
