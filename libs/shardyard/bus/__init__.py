"""Shardyard's bus: the topic catalogue, the codec, and a thin layer over FastStream/aiokafka."""
