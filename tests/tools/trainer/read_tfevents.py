#!/usr/bin/python3
"""Independent reader of TensorBoard event files (tfevents).

Tests use it as the reference decoder for the files that Tessera's TensorBoard
writer (tools/trainer/tensorboard...) writes; it shares no code with it.

Format, from tensorflow/tensorboard:
  * TFRecord framing, as in tensorboard/summary/writer/record_writer.py,
    little-endian: uint64 length; uint32 masked_crc32c(the 8 length bytes);
    data[length]; uint32 masked_crc32c(data).
  * data: an Event (tensorboard/compat/proto/event.proto) holding a
    file_version, a SessionLog (its status) or a Summary
    (tensorboard/compat/proto/summary.proto) of tagged simple_values. Any
    other field, or bad UTF-8, is an error.

Usage: /usr/bin/python3 read_tfevents.py FILE | --self-test
  Prints one JSON object per line: {"wall_time", "step", "file_version"} per
  file-version event, {"wall_time", "step", "session_log"} per session-log
  event ("START", "STOP" or "CHECKPOINT"), {"wall_time", "step", "tag",
  "simple_value"} per value of a summary event (a non-finite simple_value as
  the string "nan", "inf" or "-inf"). On malformed input, prints "read_tfevents: error: ..." to
  stderr and exits 1. Needs only the standard library and google.protobuf 3.21
  (Debian 12's python3-protobuf).
"""

import json
import math
import struct
import sys
import warnings

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import DecodeError


class FormatError(Exception):
    pass


def _crc32c_table():
    table = []
    for n in range(256):
        for _ in range(8):
            n = (n >> 1) ^ 0x82F63B78 if n & 1 else n >> 1
        table.append(n)
    return table


_CRC_TABLE = _crc32c_table()


def crc32c(data):
    crc = 0xFFFFFFFF
    for byte in data:
        crc = _CRC_TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked_crc32c(data):
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _build_event_class():
    fdp = descriptor_pb2.FieldDescriptorProto
    proto = descriptor_pb2.FileDescriptorProto(
        name="tfevents_reader.proto", package="tfevents_reader",
        syntax="proto3")

    def add(msg, name, number, type_, **kwargs):
        kwargs.setdefault("label", fdp.LABEL_OPTIONAL)
        msg.field.add(name=name, number=number, type=type_, **kwargs)

    # The proto's string fields are declared bytes here (same wire format) and
    # decoded below, so that bad UTF-8 gets our error message, not a
    # libprotobuf log line (cpp backend) or a UnicodeDecodeError (python).
    summary = proto.message_type.add(name="Summary")
    value = summary.nested_type.add(name="Value")
    value.oneof_decl.add(name="value")
    add(value, "tag", 1, fdp.TYPE_BYTES)
    add(value, "simple_value", 2, fdp.TYPE_FLOAT, oneof_index=0)
    add(summary, "value", 1, fdp.TYPE_MESSAGE, label=fdp.LABEL_REPEATED,
        type_name=".tfevents_reader.Summary.Value")
    session_log = proto.message_type.add(name="SessionLog")
    add(session_log, "status", 1, fdp.TYPE_INT32)  # the enum's wire form
    event = proto.message_type.add(name="Event")
    event.oneof_decl.add(name="what")
    add(event, "wall_time", 1, fdp.TYPE_DOUBLE)
    add(event, "step", 2, fdp.TYPE_INT64)
    add(event, "file_version", 3, fdp.TYPE_BYTES, oneof_index=0)
    add(event, "summary", 5, fdp.TYPE_MESSAGE, oneof_index=0,
        type_name=".tfevents_reader.Summary")
    add(event, "session_log", 7, fdp.TYPE_MESSAGE, oneof_index=0,
        type_name=".tfevents_reader.SessionLog")
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    # protobuf 3.21 has no message_factory.GetMessageClass; GetPrototype is it.
    return message_factory.MessageFactory(pool).GetPrototype(
        pool.FindMessageTypeByName("tfevents_reader.Event"))


Event = _build_event_class()


def decode_event(data, offset):
    """Returns the output objects of the Event in one record's data."""
    where = f"in the record data at offset {offset}"
    event = Event()
    # On a stray end-group tag, 3.21's cpp backend only warns (and stops
    # parsing there), where the python backend raises DecodeError: both end
    # up in `caught`.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            event.ParseFromString(data)
        except DecodeError as e:
            warnings.warn(str(e))
    if caught:
        raise FormatError(f"expected an Event message, found undecodable "
                          f"bytes ({caught[0].message}) {where}")
    # Proto3 keeps unknown fields (and fields of a wrong wire type) aside
    # rather than failing; 3.21's msg.UnknownFields() lists them, per message.
    values = list(event.summary.value)
    for msg in [event, event.summary, event.session_log] + values:
        if len(msg.UnknownFields()):
            numbers = sorted({f.field_number for f in msg.UnknownFields()})
            raise FormatError(f"expected only known fields, found field "
                              f"numbers {numbers} in {msg.DESCRIPTOR.name} "
                              f"{where}")

    def utf8(raw, what):
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise FormatError(f"expected UTF-8 {what}, found {raw!r} "
                              f"({e.reason}) {where}")

    head = {"wall_time": event.wall_time, "step": event.step}
    what = event.WhichOneof("what")
    if what == "file_version":
        return [dict(head, file_version=utf8(event.file_version, what))]
    if what == "session_log":
        statuses = {1: "START", 2: "STOP", 3: "CHECKPOINT"}
        status = event.session_log.status
        if status not in statuses:
            raise FormatError(f"expected a session_log status of 1 to 3, "
                              f"found {status} {where}")
        return [dict(head, session_log=statuses[status])]
    if what != "summary" or not values:
        found = "an empty summary" if what else "neither"
        raise FormatError(f"expected file_version, session_log or a "
                          f"non-empty summary, found {found} {where}")
    out = []
    for value in values:
        tag = utf8(value.tag, "tag")
        if value.WhichOneof("value") != "simple_value":
            raise FormatError(f"expected a simple_value for tag {tag!r}, "
                              f"found none {where}")
        out.append(dict(head, tag=tag, simple_value=_json_float(value.simple_value)))
    return out


def _json_float(x):
    """x, or "nan", "inf" or "-inf" (strict JSON has no such numbers)."""
    return x if math.isfinite(x) else repr(x)


def _take(buf, offset, size, what):
    if len(buf) - offset < size:
        raise FormatError(f"expected {size} bytes of {what}, found "
                          f"{len(buf) - offset} (truncated record) at offset "
                          f"{offset}")
    return buf[offset:offset + size]


def _check_crc(buf, offset, covered, what):
    found = struct.unpack("<I", _take(buf, offset, 4, what))[0]
    expected = masked_crc32c(covered)
    if found != expected:
        raise FormatError(f"expected {what} 0x{expected:08x}, found "
                          f"0x{found:08x} at offset {offset}")


def read_records(buf):
    """Yields (offset of data, data) for each TFRecord in buf."""
    offset = 0
    while offset < len(buf):
        length_bytes = _take(buf, offset, 8, "record length")
        _check_crc(buf, offset + 8, length_bytes, "length CRC")
        length = struct.unpack("<Q", length_bytes)[0]
        data = _take(buf, offset + 12, length, "record data")
        _check_crc(buf, offset + 12 + length, data, "data CRC")
        yield offset + 12, data
        offset += 16 + length


def decode_file(buf):
    return [obj for offset, data in read_records(buf)
            for obj in decode_event(data, offset)]


GOLDEN_HEX = (
    "1800000000000000 a37f4b22 0900000040fc54d9411a0d627261696e2e4576656e74"
    "3a32 eced8f9d"
    "2600000000000000 734fe300 0900006040fc54d94110402a190a170a1054726169"
    "6e2f53616d706c65732f6c72150000003f 43632ac1")
GOLDEN_EVENTS = [
    {"wall_time": 1700000000.0, "step": 0, "file_version": "brain.Event:2"},
    {"wall_time": 1700000001.5, "step": 64, "tag": "Train/Samples/lr",
     "simple_value": 0.5},
]


def self_test():
    assert crc32c(b"123456789") == 0xE3069283
    assert _CRC_TABLE[1] == 0xF26B8303 and _CRC_TABLE[255] == 0xAD7D5351
    golden = bytes.fromhex(GOLDEN_HEX.replace(" ", ""))
    assert decode_file(golden) == GOLDEN_EVENTS
    print("read_tfevents: self-test passed")


def main(argv):
    if argv == ["--self-test"]:
        self_test()
        return 0
    if len(argv) != 1:
        print("usage: read_tfevents.py FILE | --self-test", file=sys.stderr)
        return 2
    try:
        with open(argv[0], "rb") as f:
            events = decode_file(f.read())
    except (OSError, FormatError) as e:
        print(f"read_tfevents: error: {e}", file=sys.stderr)
        return 1
    for obj in events:
        print(json.dumps(obj))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
