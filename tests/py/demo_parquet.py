"""Reads the demo's archive exported as Parquet back with pyarrow and
DuckDB, as an analyst would, and prints what it found as JSON.

usage: demo_parquet.py RAW.parquet TYPED.parquet CHANNEL...
"""
import base64
import json
import sys

import duckdb
import pyarrow.parquet as pq

raw_path, typed_path, *channels = sys.argv[1:]

raw = pq.read_table(raw_path)
offsets = raw.column("offset").to_pylist()
values = raw.column("value").to_pylist()
order = sorted(range(len(offsets)), key=lambda i: offsets[i])

con = duckdb.connect()
types = dict(
    con.execute(
        "SELECT column_name, column_type FROM (DESCRIBE SELECT * FROM read_parquet(?))",
        [typed_path],
    ).fetchall()
)
count, distinct, avg_power = con.execute(
    "SELECT count(*), count(DISTINCT \"offset\"), avg(Global_active_power) FROM read_parquet(?)",
    [typed_path],
).fetchone()
print(
    json.dumps(
        {
            "raw_rows": raw.num_rows,
            "raw_distinct": len(set(offsets)),
            "raw_offsets_in_order": [offsets[i] for i in order][:3] + [offsets[i] for i in order][-1:],
            "raw_values_b64": [base64.b64encode(values[i]).decode() for i in order],
            "typed_rows": count,
            "typed_distinct": distinct,
            "types": {c: types.get(c) for c in channels + ["offset", "timestamp", "date_time"]},
            "avg_global_active_power": avg_power,
        }
    )
)
