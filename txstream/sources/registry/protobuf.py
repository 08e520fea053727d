"""Protobuf values framed by Confluent's Protobuf serializer (`txstream.sources.registry.framed`):
after the schema id, the message indexes (a zigzag varint count, then that many zigzag varints:
which message of the schema's file, nested by position; a count of 0 means the first message),
then the message. Each message is written as the JSON object the decoder reads.

The writer schema comes from the registry as `.proto` text (what a registry serves by
default), compiled by the protoc that `grpcio-tools` ships into descriptors, or as the base64
of a serialized FileDescriptorProto (what confluent-kafka's Python serializer registers); both
are loaded into a descriptor pool of their own, and protobuf's runtime parses the messages. A
schema may import protobuf's well-known types and Confluent's own files (`confluent/meta.proto`,
`confluent/type/decimal.proto`), which Confluent's serializers never register as references,
and the files its registry references name (each a subject's version, text or serialized).

The JSON keeps proto field names and reads as a JSON producer's would: 64-bit integers as
numbers (not the strings of protobuf's JSON mapping), enums by name, bytes as base64,
`google.protobuf.Timestamp` as RFC 3339 text (to the microsecond, a timestamp column's
precision), wrappers as their value, `confluent.type.Decimal` (what Confluent's
ProtobufConverter writes for decimals) as an exact numeric string, maps as objects. A field
with presence (`optional`, a message, a oneof member) that is not set is left out, so it reads
as null; a proto3 field without presence reads as its default (0, "", false), as protobuf
itself reads it.
"""

from __future__ import annotations

import base64
import binascii
import datetime
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

import msgspec
from confluent_kafka.schema_registry.confluent import meta_pb2
from confluent_kafka.schema_registry.confluent.type import decimal_pb2
from google.protobuf import (
    any_pb2,
    api_pb2,
    descriptor_pb2,
    descriptor_pool,
    duration_pb2,
    empty_pb2,
    field_mask_pb2,
    json_format,
    message_factory,
    source_context_pb2,
    struct_pb2,
    timestamp_pb2,
    type_pb2,
    wrappers_pb2,
)
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import DecodeError, Message

from txstream.sources.registry.framed import (
    FramedValues,
    SchemaUnavailable,
    SchemaUnusable,
    WriterSchema,
)

_JSON = msgspec.json.Encoder()
# Files a schema imports without a reference, dependencies first.
_BUILTINS = [m.DESCRIPTOR for m in (
    any_pb2, source_context_pb2, type_pb2, api_pb2, descriptor_pb2, duration_pb2, empty_pb2,
    field_mask_pb2, struct_pb2, timestamp_pb2, wrappers_pb2, meta_pb2, decimal_pb2)]
_WRAPPERS = {f"google.protobuf.{kind}Value" for kind in (
    "Double", "Float", "Int64", "UInt64", "Int32", "UInt32", "Bool", "String", "Bytes")}
_PROTOC_TIMEOUT_S = 60


def _builtin_set() -> descriptor_pb2.FileDescriptorSet:
    files = descriptor_pb2.FileDescriptorSet()
    for builtin in _BUILTINS:
        builtin.CopyToProto(files.file.add())
    return files


def _serialized(text: str) -> descriptor_pb2.FileDescriptorProto | None:
    """The schema when `text` is the base64 of a serialized FileDescriptorProto."""
    try:
        data = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        return None
    proto = descriptor_pb2.FileDescriptorProto()
    try:
        proto.ParseFromString(data)
    except DecodeError:
        return None
    return proto if proto.message_type else None


def _compiled(texts: dict[str, str], given: list[descriptor_pb2.FileDescriptorProto]
              ) -> list[descriptor_pb2.FileDescriptorProto]:
    """`.proto` texts (by the file name they are imported as) compiled by protoc
    (grpcio-tools'), with what they import, dependencies first: the builtins and the `given`
    descriptors (schemas the registry holds serialized) are its descriptor sets."""
    with tempfile.TemporaryDirectory(prefix="txstream-proto-") as tmp:
        root = Path(tmp)
        sources = root / "src"
        for name, text in texts.items():
            (sources / name).parent.mkdir(parents=True, exist_ok=True)
            (sources / name).write_text(text)
        known = _builtin_set()
        known.file.extend(given)
        (root / "known.pb").write_bytes(known.SerializeToString())
        out = root / "out.pb"
        # protoc in a child process: its errors go to the stderr of the process, which the
        # reason quotes.
        try:
            done = subprocess.run(
                [sys.executable, "-c", "import sys; from grpc_tools import protoc; "
                 "sys.exit(protoc.main(['protoc', *sys.argv[1:]]))",
                 f"--proto_path={sources}", f"--descriptor_set_in={root / 'known.pb'}",
                 "--include_imports", f"--descriptor_set_out={out}", *texts],
                capture_output=True, text=True, timeout=_PROTOC_TIMEOUT_S, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise SchemaUnavailable(f"protoc could not compile the .proto text ({exc}); "
                                    "replay this dead letter once it can") from exc
        if done.returncode != 0:
            raise SchemaUnusable("the .proto text does not compile: "
                                 f"{done.stderr.strip() or done.stdout.strip()}")
        files = descriptor_pb2.FileDescriptorSet()
        files.ParseFromString(out.read_bytes())
    return list(files.file)


@dataclass
class Messages:
    """The message types of one writer schema, by message indexes."""

    pool: descriptor_pool.DescriptorPool
    file: descriptor_pb2.FileDescriptorProto
    classes: dict[tuple[int, ...], type[Message]] = field(default_factory=dict)

    def of(self, indexes: tuple[int, ...], schema_id: int) -> type[Message]:
        cls = self.classes.get(indexes)
        if cls is not None:
            return cls
        names, types = [], self.file.message_type
        for i in indexes:
            if not 0 <= i < len(types):
                raise ValueError(f"message indexes {list(indexes)} name no message of writer "
                                 f"schema id {schema_id}; the record is corrupt or was written "
                                 "with another registry's id")
            names.append(types[i].name)
            types = types[i].nested_type
        full = ".".join([self.file.package, *names] if self.file.package else names)
        cls = self.classes[indexes] = message_factory.GetMessageClass(
            self.pool.FindMessageTypeByName(full))
        return cls


def _varint(body: bytes, at: int) -> tuple[int, int]:
    """The zigzag varint at `at` of `body` and where the next one starts."""
    value = shift = 0
    while True:
        if at >= len(body) or shift > 63:
            raise ValueError("message indexes cut short or malformed")
        byte = body[at]
        value |= (byte & 0x7F) << shift
        at, shift = at + 1, shift + 7
        if not byte & 0x80:
            return (value >> 1) ^ -(value & 1), at


def message_indexes(body: bytes) -> tuple[tuple[int, ...], int]:
    """The message indexes at the start of a framed Protobuf body, and where the message
    starts."""
    count, at = _varint(body, 0)
    if count == 0:  # the first message, the common case, in one byte
        return (0,), at
    if not 0 < count <= 100:
        raise ValueError(f"{count} message indexes: not Confluent's Protobuf framing")
    indexes = []
    for _ in range(count):
        index, at = _varint(body, at)
        indexes.append(index)
    return tuple(indexes), at


Convert = Callable[[Any], Any]
_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)


def _decimal(value: Any) -> str:
    unscaled = int.from_bytes(value.value, "big", signed=True)
    return str(Decimal(unscaled).scaleb(-value.scale))


def _timestamp(value: Any) -> datetime.datetime:
    # To microseconds, a timestamp column's precision (msgspec writes it as RFC 3339 text).
    return _EPOCH + datetime.timedelta(seconds=value.seconds, microseconds=value.nanos // 1000)


def _converter(fd: FieldDescriptor) -> Convert | None:
    """How one value of `fd` becomes JSON; None: as it is (numbers, text, booleans)."""
    if fd.type in (FieldDescriptor.TYPE_MESSAGE, FieldDescriptor.TYPE_GROUP):
        name = fd.message_type.full_name
        if name == "google.protobuf.Timestamp":
            return _timestamp
        if name in _WRAPPERS:
            inner = _converter(fd.message_type.fields_by_name["value"])
            return (lambda v: v.value) if inner is None else (lambda v: inner(v.value))
        if name == "confluent.type.Decimal":
            return _decimal
        if name.startswith("google.protobuf."):
            return lambda v: json_format.MessageToDict(v, preserving_proto_field_name=True)
        return as_json
    if fd.type == FieldDescriptor.TYPE_ENUM:
        names = {v.number: v.name for v in fd.enum_type.values}
        return lambda v: names.get(v, v)
    # Bytes stay bytes: the JSON encoder writes them as base64, as the JSON converter would.
    return None


def _field_converter(fd: FieldDescriptor) -> Convert | None:
    """How the value of `fd` (a map, a repeated field or a single value) becomes JSON."""
    if fd.message_type is not None and fd.message_type.GetOptions().map_entry:
        item = _converter(fd.message_type.fields_by_name["value"])
        if item is None:
            return lambda m: {str(k): v for k, v in m.items()}
        return lambda m: {str(k): item(v) for k, v in m.items()}
    one = _converter(fd)
    if fd.is_repeated:
        return (lambda vs: list(vs)) if one is None else (lambda vs: [one(v) for v in vs])
    return one


# Per message type, each field's name, whether it has presence, and its converter: worked out
# once, so that a message costs a getattr per field and a call per field that needs one.
_Plan = list[tuple[str, bool, Convert | None]]
_PLANS: dict[Descriptor, _Plan] = {}


def _plan(descriptor: Descriptor) -> _Plan:
    plan = _PLANS.get(descriptor)
    if plan is None:
        plan = _PLANS[descriptor] = [
            (fd.name, fd.has_presence and not fd.is_repeated, _field_converter(fd))
            for fd in descriptor.fields]
    return plan


def as_json(message: Message) -> dict[str, Any]:
    """`message` as the JSON object the decoder reads (see the module doc)."""
    out: dict[str, Any] = {}
    for name, presence, convert in _plan(message.DESCRIPTOR):
        if presence and not message.HasField(name):
            continue
        value = getattr(message, name)
        out[name] = value if convert is None else convert(value)
    return out


class ProtobufValues(FramedValues):
    """Transcodes a source's Protobuf values to JSON (see the module doc)."""

    schema_type = "PROTOBUF"
    value_format = "protobuf"
    serializer = "Protobuf serializer"

    def _parse(self, schema: WriterSchema, imports: list[tuple[str, WriterSchema]],
               schema_id: int) -> Any:
        name = f"schema_{schema_id}.proto"
        texts: dict[str, str] = {}
        given: list[descriptor_pb2.FileDescriptorProto] = []
        for file_name, file in [*imports, (name, schema)]:
            serialized = _serialized(file.text)
            if serialized is None:
                texts[file_name] = file.text
            else:
                serialized.name = file_name
                given.append(serialized)
        files = []
        if texts:
            try:
                files = _compiled(texts, given)
            except SchemaUnavailable as exc:  # of its kind: unusable for good, or for now
                raise type(exc)(f"schema id {schema_id}: {exc}") from exc
        pool = descriptor_pool.DescriptorPool()
        for builtin in _BUILTINS:
            pool.AddSerializedFile(builtin.serialized_pb)
        added = {builtin.name for builtin in _BUILTINS}
        try:
            # Dependencies first: protoc's output (imports first), then the serialized files
            # in the order they import each other (`resolved`), the schema's own last.
            for proto in [*files, *given]:
                if proto.name not in added:
                    pool.AddSerializedFile(proto.SerializeToString())
                    added.add(proto.name)
        except (TypeError, KeyError, ValueError) as exc:
            raise SchemaUnusable(f"schema id {schema_id} is no usable Protobuf schema: "
                                 f"{exc}") from exc
        own = next(f for f in [*files, *given] if f.name == name)
        return Messages(pool, own)

    def _decode(self, writer: Any, body: bytes, schema_id: int) -> bytes:
        indexes, start = message_indexes(body)
        message = writer.of(indexes, schema_id)()
        try:
            message.ParseFromString(body[start:])
        except DecodeError as exc:
            raise ValueError(f"Protobuf message does not decode with writer schema id "
                             f"{schema_id} ({exc}); the record is corrupt or was written "
                             "with another registry's id") from exc
        try:
            return _JSON.encode(as_json(message))
        except OverflowError as exc:  # a Timestamp beyond the years 1 to 9999
            raise ValueError(f"Protobuf message of writer schema id {schema_id} holds a "
                             f"value out of range ({exc})") from exc
