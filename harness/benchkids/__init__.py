"""Child processes of the benchmark suite (`harness.bench`): the daemons under load, the load
generators and the bare-library baselines (DESIGN §1: the only other importers of aiomqtt,
pymodbus and influxdb-client besides the adapters).
Run as ``python -m harness.benchkids.<name>``."""
