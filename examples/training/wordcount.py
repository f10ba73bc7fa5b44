"""Count the words of a text file on a Spark cluster: Mesh's `spark` framework example.

    spark-submit --master spark://HOST:PORT wordcount.py INPUT OUTPUT.json

Words are whitespace-separated tokens, counted as they are (case kept). OUTPUT gets
``{"total": N, "distinct": K, "counts": {word: n, ...}, "executors": E}``, written
whole (a temporary file renamed), so a reader never sees half of it.

The driver reads INPUT and ships its lines to the executors (``parallelize``) rather
than have each executor open the path (``textFile``): Mesh's nodes share no file
system, and a driver-side path means nothing on a worker's host. That bounds INPUT to
what the driver can hold, which is fine for an example.
"""

from __future__ import annotations

import json
import os
import sys
from operator import add


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: wordcount.py INPUT OUTPUT.json", file=sys.stderr)
        return 2
    source, target = argv
    from pyspark.sql import SparkSession  # here: the usage error needs no JVM

    spark = SparkSession.builder.appName("mesh-wordcount").getOrCreate()
    try:
        sc = spark.sparkContext
        with open(source, encoding="utf-8") as f:
            lines = f.read().splitlines()
        slices = max(2, sc.defaultParallelism)
        counts = dict(
            sc.parallelize(lines, slices)
            .flatMap(str.split)
            .map(lambda word: (word, 1))
            .reduceByKey(add)
            .collect()
        )
        # Executors registered, the driver excluded: shows the work could leave the driver.
        executors = sc._jsc.sc().getExecutorMemoryStatus().size() - 1
    finally:
        spark.stop()
    result = {
        "total": sum(counts.values()),
        "distinct": len(counts),
        "counts": dict(sorted(counts.items())),
        "executors": executors,
    }
    partial = f"{target}.tmp"
    with open(partial, "w", encoding="utf-8") as f:
        json.dump(result, f)
    os.replace(partial, target)
    print(f"wordcount: {result['total']} words, {result['distinct']} distinct")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
