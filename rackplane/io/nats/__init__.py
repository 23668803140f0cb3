"""NATS JetStream adapters: the key-value store (`rackplane.io.nats.kv`, the only importer of
nats-py) and the leadership lease runner on it (`rackplane.io.nats.lease`)."""
