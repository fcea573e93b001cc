"""Write the arithmetic example's prompt file: ``python -m examples.arithmetic.make_prompts --out FILE``.

Each row is a sum of two whole numbers drawn from the seed: ``prompt`` ("3 + 5 = ?"), the operands ``a`` and ``b``
and the ``solution`` (the reward's column and the scripted teacher's answer). ``.jsonl`` or ``.parquet`` by the
name of ``--out``.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path


def prompt_rows(count: int, max_operand: int, seed: int) -> list[dict[str, object]]:
    """``count`` rows of ``a + b`` with ``a``, ``b`` drawn uniformly from 0..``max_operand``."""
    rng = random.Random(seed)
    rows = []
    for _ in range(count):
        a, b = rng.randint(0, max_operand), rng.randint(0, max_operand)
        rows.append({"prompt": f"{a} + {b} = ?", "a": a, "b": b, "solution": a + b})
    return rows


def write_rows(rows: list[dict[str, object]], out: Path) -> None:
    """Write ``rows`` as JSONL, or Parquet when ``out`` ends in ``.parquet``."""
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(rows), out)
        return
    out.write_text("".join(json.dumps(row) + "\n" for row in rows))


def main() -> None:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("examples/arithmetic/prompts.jsonl"))
    parser.add_argument("--count", type=int, default=1000, help="rows (default 1000)")
    parser.add_argument("--max-operand", type=int, default=9, help="largest operand (default 9: one digit)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    write_rows(prompt_rows(args.count, args.max_operand, args.seed), args.out)
    print(f"wrote {args.count} prompts to {args.out}")


if __name__ == "__main__":
    main()
