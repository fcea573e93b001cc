"""Reading a W&B offline run back: its transaction log (``run-<id>.wandb``), whatever wandb version wrote it.

``python -m ragen_core.monitor.trackers.wandb_log <data root>/runs/<run id>/trackers/wandb`` prints, as JSON, each
offline attempt's run id, config, exit code, summary (the last value of each metric) and history (each metric's
``[step, value]`` points), the attempts in order; :func:`offline_runs` returns the same in Python. wandb 0.31 keeps
no Python reader of its own (``wandb.sdk.internal.datastore`` went with the Go core, ``wandb sync
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
    if len(data) < HEADER.size or HEADER.unpack_from(data) != (b":W&B", 0xBEE1, 0):
        raise ValueError(f"{path} is no W&B transaction log")
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
        if kind > LAST or zlib.crc32(body, seeds[kind]) != checksum:
            raise ValueError(f"{path}: bad checksum at byte {position} (a damaged or unfinished log)")
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


def offline_runs(folder: Path) -> list[dict[str, Any]]:
    """Each offline attempt under ``folder`` (a run's ``trackers/wandb``: W&B's ``offline-run-<time>-<id>/``
    folders, in time order): ``{"folder", "id", "config", "exit_code", "summary", "history"}``."""
    attempts = []
    for log in sorted(Path(folder).glob("**/offline-run-*/run-*.wandb")):
        records = read_records(log)
        run = run_record(records)
        points = history(records)
        attempts.append(
            {
                "folder": str(log.parent),
                "id": run.run_id,
                "config": config_of(run),
                "exit_code": exit_code(records),
                "summary": {name: values[-1][1] for name, values in sorted(points.items())},
                "history": {name: [list(point) for point in values] for name, values in sorted(points.items())},
            }
        )
    return attempts


def main(argv: list[str]) -> int:
    """The command line: the offline runs of one folder as JSON on stdout; a mistake is one line on stderr."""
    import sys

    if len(argv) != 1:
        print("usage: python -m ragen_core.monitor.trackers.wandb_log <folder of offline W&B runs>", file=sys.stderr)
        return 2
    try:
        attempts = offline_runs(Path(argv[0]))
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if not attempts:
        print(f"error: no W&B offline run (offline-run-*/run-*.wandb) under {argv[0]}", file=sys.stderr)
        return 1
    print(json.dumps(attempts, indent=1))
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv[1:]))
