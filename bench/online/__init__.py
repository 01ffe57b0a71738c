"""The online-training benchmarks, one package over one workload (:mod:`bench.online.workload`:
the Wide&Deep models, the Criteo-like stream and its producer, the online phases and the bare
step they are divided by). Run from the repository root:

    python -m bench.online [--scale | --soak | --ckpt-check]   # throughput, freshness, scale
    python -m bench.online.paired            # the loop over the bare step, in alternation
    python -m bench.online.pool --runs ...   # paired runs pooled by cycle
    python -m bench.online.faults            # kill -9 / SIGTERM at 26 M rows
    python -m bench.online.write_cost        # a checkpoint write beside the bare step
    python -m bench.online.cotenant          # the bare step beside the producer
    python -m bench.online.bare_batches      # fresh vs recycled batches in the bare step
    python -m bench.online.huge_pages        # tables on 2 MiB pages vs 4 KiB
    python -m bench.online.shard_read        # a stream shard's read and check
    python -m bench.online.increment_resume  # reading a chain of row increments
"""
