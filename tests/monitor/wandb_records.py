"""Reading a W&B run's transaction log (``run-<id>.wandb``) back, for the tests.

wandb 0.31 keeps no Python reader of its own (``wandb.sdk.internal.datastore`` went with the Go core, ``wandb sync
--view`` with it); the file is LevelDB's log format (github.com/google/leveldb, doc/log_format.md) under W&B's
header (``:W&B``, magic 0xBEE1, version 0), each record a ``wandb_internal_pb2.Record`` protobuf. This reader
checks every chunk's CRC, so a misread file fails loudly instead of giving wrong numbers, and decodes the records
with wandb's own protobuf classes.
"""

from __future__ import annotations

import json
import struct
import zlib
from pathlib import Path
from typing import Any

BLOCK = 32768
HEADER = struct.Struct("<4sHB")  # ident, magic, version
CHUNK = struct.Struct("<IHB")  # checksum, length, type
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def read_records(path: Path) -> list[Any]:
    """Every record of the log, in order (``wandb.proto.wandb_internal_pb2.Record``)."""
    from wandb.proto import wandb_internal_pb2

    data = Path(path).read_bytes()
    assert HEADER.unpack_from(data) == (b":W&B", 0xBEE1, 0), f"{path} is no W&B transaction log"
    seeds = [zlib.crc32(bytes([kind])) for kind in range(LAST + 1)]
    records, pending, position = [], b"", HEADER.size
    while position + CHUNK.size <= len(data):
        left = BLOCK - position % BLOCK
        if left < CHUNK.size:  # a block's trailer: too short for a chunk header, zero-filled
            position += left
            continue
        checksum, length, kind = CHUNK.unpack_from(data, position)
        if (checksum, length, kind) == (0, 0, 0):  # zero padding to the block's end
            position += left
            continue
        body = data[position + CHUNK.size : position + CHUNK.size + length]
        assert zlib.crc32(body, seeds[kind]) == checksum, f"{path}: bad checksum at byte {position}"
        position += CHUNK.size + length
        pending += body
        if kind in (FULL, LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
            pending = b""
    return records


def history(records: list[Any]) -> dict[str, list[tuple[int, float]]]:
    """name -> [(step, value)] of the logged scalars (W&B's own ``_step``, ``_runtime``, ``_timestamp`` left out)."""
    out: dict[str, list[tuple[int, float]]] = {}
    for record in records:
        if record.WhichOneof("record_type") != "history":
            continue
        step = record.history.step.num
        for item in record.history.item:
            name = item.key or "/".join(item.nested_key)
            if not name.startswith("_"):
                out.setdefault(name, []).append((step, float(json.loads(item.value_json))))
    return out


def run_record(records: list[Any]) -> Any:
    """The run's own record (id, project, name, tags, config)."""
    return next(r.run for r in records if r.WhichOneof("record_type") == "run")


def config_of(run: Any) -> dict[str, Any]:
    """The run record's config, key -> value (W&B's own ``_wandb`` key left out)."""
    return {item.key: json.loads(item.value_json) for item in run.config.update if item.key != "_wandb"}


def exit_code(records: list[Any]) -> int | None:
    """The exit code the run finished with (None: not finished)."""
    codes = [r.exit.exit_code for r in records if r.WhichOneof("record_type") == "exit"]
    return codes[-1] if codes else None
