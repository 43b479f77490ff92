"""Training runtime of one Shardyard shard: config, model, data, parameter sync, progress and the runner."""
