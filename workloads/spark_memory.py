"""What a Spark JVM needs, in bytes: shared by the spec (which refuses a worker or a
driver too small to start, at submit) and the spark adapter (which sizes the heaps).
Its own module because the spec cannot import the adapters (they import the spec)."""

MiB = 2**20
DAEMON_HEAP = 128 * MiB  # SPARK_DAEMON_MEMORY of the master (at least) and the worker
DAEMON_FOOTPRINT = 2 * DAEMON_HEAP  # a daemon's resident size: measured ~200 MiB
MIN_OVERHEAD = 384 * MiB
MIN_HEAP = 450 * MiB  # Spark's floor (UnifiedMemoryManager: 300 MiB reserved * 1.5)
MIN_DRIVER_MEMORY = MIN_HEAP + MIN_OVERHEAD
MIN_WORKER_MEMORY = MIN_HEAP + MIN_OVERHEAD + DAEMON_FOOTPRINT
# The master's JVM is resident at ~156 MiB with a 128m heap: what one added by the spec gets.
MASTER_MEMORY = 512 * MiB
MASTER_CPU = 500  # millicores
