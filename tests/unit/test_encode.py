import pytest
from gpumetrics.metrics import (
    EncodingError,
    Point,
    catalogue,
    encode_attributes,
    encode_metric,
    names,
)
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.metrics.v1 import metrics_pb2

T = 1_700_000_000_000_000_000


def kv_list(attrs):
    holder = common_pb2.KeyValueList()
    encode_attributes(holder.values, attrs)
    return holder.values


def test_gauge_encoding_field_by_field():
    m = metrics_pb2.Metric()
    n = encode_metric(
        m,
        catalogue().metrics[names.MetricPower],
        [Point(312.5, T, (("hw.id", "GPU-1"), ("hw.type", "gpu")))],
    )
    expected = metrics_pb2.Metric(name="hw.power", description=m.description, unit="W")
    dp = expected.gauge.data_points.add(time_unix_nano=T, as_double=312.5)
    dp.attributes.add(key="hw.id").value.string_value = "GPU-1"
    dp.attributes.add(key="hw.type").value.string_value = "gpu"
    assert n == 1
    assert m == expected


def test_updowncounter_is_cumulative_non_monotonic_int_sum_with_start_time():
    m = metrics_pb2.Metric()
    encode_metric(m, catalogue().metrics[names.MetricGPUMemoryUsage], [Point(2**40, T, (), T - 10)])
    assert m.WhichOneof("data") == "sum"
    assert m.sum.aggregation_temporality == metrics_pb2.AGGREGATION_TEMPORALITY_CUMULATIVE
    assert m.sum.is_monotonic is False
    dp = m.sum.data_points[0]
    assert (dp.WhichOneof("value"), dp.as_int, dp.start_time_unix_nano) == ("as_int", 2**40, T - 10)


def test_counter_is_cumulative_monotonic_sum():
    m = metrics_pb2.Metric()
    encode_metric(m, catalogue().metrics[names.MetricEnergy], [Point(12.5, T, (), T - 10)])
    assert m.sum.is_monotonic is True
    assert m.sum.aggregation_temporality == metrics_pb2.AGGREGATION_TEMPORALITY_CUMULATIVE


def test_attribute_value_types_map_to_anyvalue_members():
    kvs = kv_list(
        [
            ("s", "x"),
            ("b", True),
            ("i", 7),
            ("d", 1.5),
            ("y", b"\x00\xff"),
            ("a", ["p", 1]),
            ("m", {"k": "v"}),
            ("skipped", None),
        ]
    )
    got = {kv.key: kv.value.WhichOneof("value") for kv in kvs}
    assert got == {
        "s": "string_value",
        "b": "bool_value",
        "i": "int_value",
        "d": "double_value",
        "y": "bytes_value",
        "a": "array_value",
        "m": "kvlist_value",
    }
    assert [v.WhichOneof("value") for v in kvs[5].value.array_value.values] == [
        "string_value",
        "int_value",
    ]


def test_duplicate_attribute_keys_are_an_error():
    with pytest.raises(EncodingError, match="'k': duplicate"):
        kv_list([("k", "a"), ("k", "b")])


def test_int_outside_int64_is_an_error_naming_the_key():
    with pytest.raises(EncodingError, match="'big'"):
        kv_list([("big", 2**63)])


def test_lone_surrogates_are_replaced_so_the_message_serializes():
    kvs = kv_list([("name", "pyth\udce9n")])
    assert kvs[0].value.string_value == "pyth?n"
    kvs[0].SerializeToString()


def test_encoding_error_names_the_metric():
    m = metrics_pb2.Metric()
    with pytest.raises(EncodingError, match="hw.power"):
        encode_metric(
            m, catalogue().metrics[names.MetricPower], [Point(1.0, T, (("k", object()),))]
        )
