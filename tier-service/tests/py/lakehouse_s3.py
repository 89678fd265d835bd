"""Reads a topic's lakehouse files from S3 (moto) with pyarrow's S3
filesystem as a Hive-partitioned dataset and prints what it found as JSON.

usage: lakehouse_s3.py ENDPOINT BUCKET PATH
"""
import json
import sys

import pyarrow.compute as pc
import pyarrow.dataset as ds
from pyarrow import fs

endpoint, bucket, path = sys.argv[1:4]
s3 = fs.S3FileSystem(
    access_key="testing",
    secret_key="testing",
    region="us-east-1",
    scheme="http",
    endpoint_override=endpoint,
)
# Files and directories starting with "_" (the _rejected files) are not
# part of the dataset, as for Spark and Hive.
dataset = ds.dataset(f"{bucket}/{path}", filesystem=s3, format="parquet", partitioning="hive")
table = dataset.to_table()
agg = table.group_by("date").aggregate([("offset", "count")])
by_date = dict(zip(map(str, agg.column("date").to_pylist()), agg.column("offset_count").to_pylist()))
offsets = table.column("offset")
print(
    json.dumps(
        {
            "rows": table.num_rows,
            "distinct": pc.count_distinct(offsets).as_py(),
            "min": pc.min(offsets).as_py(),
            "max": pc.max(offsets).as_py(),
            "by_date": by_date,
            "columns": table.schema.names,
            "sum_n": pc.sum(table.column("n")).as_py(),
        }
    )
)
