"""Streaming export: cut a checkpoint shard by shard, never loading the model."""
