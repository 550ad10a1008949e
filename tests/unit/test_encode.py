import pytest
from gpumetrics.metrics import (
    EncodingError,
    Point,
    catalogue,
    encode_attributes,
    encode_metric,
    names,
)
from gpumetrics.metrics.encode import AttributeCache, set_any_value
from hypothesis import given, settings
from hypothesis import strategies as st
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


# --- the cached attribute entries give the field-by-field protobuf encoding ----------------------


def reference_metric(spec, points):
    """The plain protobuf-API encoding, every attribute set one by one, that the encoder (with or
    without its attribute cache) must reproduce."""
    m = metrics_pb2.Metric(name=spec.name, description=spec.description, unit=spec.unit)
    if spec.instrument.is_sum:
        data = m.sum
        data.aggregation_temporality = metrics_pb2.AGGREGATION_TEMPORALITY_CUMULATIVE
        data.is_monotonic = spec.instrument.is_monotonic
    else:
        data = m.gauge
        data.SetInParent()
    for p in points:
        dp = data.data_points.add(time_unix_nano=p.time_unix_nano)
        if p.start_time_unix_nano:
            dp.start_time_unix_nano = p.start_time_unix_nano
        if spec.value_type.value == "int":
            dp.as_int = p.value
        else:
            dp.as_double = p.value
        for k, v in p.attributes:
            set_any_value(dp.attributes.add(key=k).value, v, k)
    return m


scalar = st.one_of(
    st.text(max_size=8),
    st.booleans(),
    st.integers(-(2**63), 2**63 - 1),
    st.floats(allow_nan=False),
    st.binary(max_size=4),
)
attr_value = st.one_of(scalar, st.lists(scalar, max_size=3))
attributes = st.dictionaries(st.text(min_size=1, max_size=6), attr_value, max_size=4).map(
    lambda d: tuple(d.items())
)
times = st.integers(1, 2**64 - 1)


@settings(max_examples=300, deadline=None)
@given(
    name=st.sampled_from(
        [names.MetricPower, names.MetricEnergy, names.MetricGPUMemoryUsage, names.MetricErrors]
    ),
    raw=st.lists(
        st.tuples(st.integers(0, 2**63 - 1), st.floats(0, 1e12), times, times, attributes),
        max_size=6,
    ),
    use_cache=st.booleans(),
)
def test_encoding_equals_the_field_by_field_encoding(name, raw, use_cache):
    spec = catalogue().metrics[name]
    is_int = spec.value_type.value == "int"
    points = [
        Point(i if is_int else f, t, attrs, s if spec.instrument.is_sum else 0)
        for i, f, t, s, attrs in raw
    ]
    got = metrics_pb2.Metric()
    assert encode_metric(got, spec, points, {} if use_cache else None) == len(points)
    assert got == reference_metric(spec, points)


def test_the_attribute_cache_is_filled_once_per_distinct_tuple_and_reused():
    spec = catalogue().metrics[names.MetricPower]
    a, b = (("hw.id", "GPU-1"),), (("hw.id", "GPU-2"),)
    cache: AttributeCache = {}
    m1, m2 = metrics_pb2.Metric(), metrics_pb2.Metric()
    encode_metric(m1, spec, [Point(1.0, T, a), Point(2.0, T, b), Point(3.0, T, a)], cache)
    assert set(cache) == {a, b}
    cache[a] = cache[b]  # a poisoned entry proves the second call reads the cache
    encode_metric(m2, spec, [Point(1.0, T, a)], cache)
    assert m2.gauge.data_points[0].attributes[0].value.string_value == "GPU-2"


def test_unhashable_attribute_values_are_encoded_without_the_cache():
    spec = catalogue().metrics[names.MetricPower]
    cache: AttributeCache = {}
    m = metrics_pb2.Metric()
    encode_metric(m, spec, [Point(1.0, T, (("tags", ["a", "b"]),))], cache)
    assert cache == {}
    assert [
        v.string_value for v in m.gauge.data_points[0].attributes[0].value.array_value.values
    ] == ["a", "b"]
