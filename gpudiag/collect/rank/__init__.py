"""Inside each rank: the bootstrap, the rank hook, its patches, telemetry and hang dumps."""
