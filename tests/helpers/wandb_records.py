"""Read the metrics that an offline wandb run wrote to its ``run-*.wandb`` file.

The file is wandb's record log: a 7-byte header (":W&B", magic, version), then 32 KiB blocks of
chunks, each with a 7-byte header (CRC32, little-endian length, type: 1 full, 2 first, 3 middle,
4 last) holding serialized ``Record`` protobufs. Only tests use this.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

from wandb.proto import wandb_internal_pb2

_FILE_HEADER = 7
_BLOCK = 32 * 1024
_CHUNK_HEADER = 7


def _payloads(data: bytes) -> list[bytes]:
    payloads, pending, pos = [], b"", _FILE_HEADER
    while pos + _CHUNK_HEADER <= len(data):
        room = _BLOCK - (pos % _BLOCK)
        if room < _CHUNK_HEADER:  # block trailer padding
            pos += room
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + _CHUNK_HEADER])
        chunk = data[pos + _CHUNK_HEADER : pos + _CHUNK_HEADER + length]
        pos += _CHUNK_HEADER + length
        if kind == 0 and length == 0:
            continue
        pending += chunk
        if kind in (1, 4):
            payloads.append(pending)
            pending = b""
    return payloads


def logged_history(run_file: Path) -> list[dict[str, object]]:
    """Every ``history`` row (a dict of metric name -> value) in the order it was logged."""
    rows = []
    for payload in _payloads(run_file.read_bytes()):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(payload)
        if record.WhichOneof("record_type") == "history":
            rows.append(
                {
                    item.key or "/".join(item.nested_key): json.loads(item.value_json)
                    for item in record.history.item
                }
            )
    return rows
