"""What-if analyses over traces: batch size, (later) checkpointing, precision, sharding."""
