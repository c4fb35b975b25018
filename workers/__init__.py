"""What runs inside a worker process (importable as ``shmpool.workers``)."""
