import pytest
from gpumetrics.wire import len_field, varint, varint_field
from hypothesis import given
from hypothesis import strategies as st
from opentelemetry.proto.common.v1 import common_pb2


@pytest.mark.parametrize(
    ("n", "encoded"),
    [
        (0, b"\x00"),
        (1, b"\x01"),
        (127, b"\x7f"),
        (128, b"\x80\x01"),
        (300, b"\xac\x02"),
        (16383, b"\xff\x7f"),
        (16384, b"\x80\x80\x01"),
        (2**64 - 1, b"\xff" * 9 + b"\x01"),
    ],
)
def test_varint_table(n, encoded):
    assert varint(n) == encoded


def test_negative_varint_is_refused():
    with pytest.raises(ValueError, match="negative"):
        varint(-1)


@given(key=st.text(max_size=300), number=st.integers(0, 2**63 - 1))
def test_hand_encoded_fields_parse_as_protobuf(key, number):
    # KeyValue{key = 1 (LEN); value = 2 (LEN) AnyValue{int_value = 3 (VARINT)}}
    raw = len_field(1, key.encode("utf-8", "surrogatepass")) + len_field(2, varint_field(3, number))
    if any(0xD800 <= ord(c) <= 0xDFFF for c in key):
        return  # not valid UTF-8: protobuf would refuse the string, as it should
    kv = common_pb2.KeyValue.FromString(raw)
    assert (kv.key, kv.value.int_value) == (key, number)
