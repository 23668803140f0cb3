"""Private test servers: Mosquitto, VictoriaMetrics, InfluxDB 1.x and a 3-node NATS JetStream
cluster on free loopback ports.

Each server is a real process (Debian packages ``mosquitto``, ``victoria-metrics``,
``influxdb`` and ``nats-server``) with its own config and data directory. A missing binary
raises `ServerMissing` (the test suite's fixtures in ``tests/servers.py`` turn it into a skip on
a developer machine and a failure under ``CI=true``, DESIGN §5). No pytest needed: the
benchmarks start servers here too. Servers can be stopped and started again on the same port,
to test outages and broker restarts.
"""

from __future__ import annotations

import base64
import functools
import json
import os
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from harness.ports import accepts, free_port, listening_inodes, listens_on, wait_port

__all__ = [
    "InfluxDB1",
    "Mosquitto",
    "NatsCluster",
    "NatsNode",
    "PortClash",
    "ServerMissing",
    "ServerProcess",
    "VictoriaMetrics",
    "free_port",
    "fresh_ports_on_clash",
    "influxdb1_config",
    "mosquitto_config",
    "nats_node_config",
    "require_binary",
    "start_influxdb1",
    "start_mosquitto",
    "start_nats_cluster",
    "start_victoria",
    "wait_port",
]


class ServerMissing(RuntimeError):
    """A server binary is not installed; the message names the Debian package."""


class PortClash(RuntimeError):
    """A server could not bind a port picked as free: something took it in between."""


_Started = TypeVar("_Started")


def fresh_ports_on_clash(start: Callable[..., _Started]) -> Callable[..., _Started]:
    """Decorator: run ``start`` again when it raised `PortClash` (a server lost a port race);
    3 tries. ``start`` must pick fresh ports (`free_port`) on each call."""

    @functools.wraps(start)
    def wrapper(*args: Any, **kwargs: Any) -> _Started:
        for attempt in range(3):
            try:
                return start(*args, **kwargs)
            except PortClash:
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    return wrapper


def require_binary(name: str, package: str) -> str:
    """Path of ``name``.

    Raises:
        ServerMissing: it is not installed (the message names the Debian ``package``).
    """
    path = shutil.which(name) or (
        f"/usr/sbin/{name}" if os.path.exists(f"/usr/sbin/{name}") else None
    )
    if path:
        return path
    msg = f"{name} not found: install the Debian package '{package}' (make test does this as root)"
    raise ServerMissing(msg)


@dataclass
class ServerProcess:
    """A server process that can be stopped and started again with the same arguments."""

    argv: list[str]
    port: int
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None

    def listen_ports(self) -> list[int]:
        """Every TCP port the server binds (``port`` first): `start` waits for all."""
        return [self.port]

    def start(self) -> None:
        """Start the process and wait (10 s) until it listens on all `listen_ports` itself.

        Raises:
            PortClash: it exited or did not come up and its log says an address was in
                use, or another process holds one of its ports (it lost a port race).
            RuntimeError: it exited or did not come up within 10 s for another reason.
        """
        if self.proc is not None and self.proc.poll() is None:
            return
        log = self.log_path.open("ab")
        log_start = log.tell()
        self.proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT)
        log.close()  # the child holds its own copy
        ports = self.listen_ports()
        deadline = time.monotonic() + 10.0
        while self.proc.poll() is None:
            # an accepted connection may be another program's listener on a port this one
            # failed to bind: it must listen on every port itself
            owned = listens_on(self.proc.pid, ports)
            if owned or (owned is None and accepts(ports[0])):
                return
            if time.monotonic() >= deadline:
                break
            time.sleep(0.02)
        self.stop()
        with self.log_path.open("rb") as fh:
            fh.seek(log_start)
            tail = fh.read().decode(errors="replace")[-2000:]
        taken = [p for p in ports if listening_inodes(p)]  # ours is stopped: someone else's
        clash = "address already in use" in tail.lower() or bool(taken)
        error = PortClash if clash else RuntimeError
        where = f" (port(s) {taken} held by another process)" if taken else ""
        raise error(f"{self.argv[0]} did not start{where}; log:\n{tail}")

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.proc = None

    def restart(self) -> None:
        self.stop()
        self.start()

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


@dataclass
class Mosquitto(ServerProcess):
    """A private Mosquitto. ``host``/``port`` for clients."""

    host: str = "127.0.0.1"


def mosquitto_config(port: int, extra: str = "") -> str:
    """Minimal test broker config (TEST-SERVERS.md): no persistence, no silent queue drops."""
    return (
        f"listener {port} 127.0.0.1\n"
        "allow_anonymous true\n"
        "persistence false\n"
        "set_tcp_nodelay true\n"
        "max_queued_messages 0\n"
        f"{extra}"
    )


@fresh_ports_on_clash
def start_mosquitto(tmp: Path, extra_conf: str = "") -> Mosquitto:
    binary = require_binary("mosquitto", "mosquitto")
    port = free_port()
    conf = tmp / "mosquitto.conf"
    conf.write_text(mosquitto_config(port, extra_conf))
    srv = Mosquitto(argv=[binary, "-c", str(conf)], port=port, log_path=tmp / "mosquitto.log")
    srv.start()
    return srv


@dataclass
class VictoriaMetrics(ServerProcess):
    """A private VictoriaMetrics, the InfluxDB-protocol database of the tests."""

    data_dir: Path = field(default_factory=Path)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _get(self, path: str, params: dict[str, str] | None = None) -> bytes:
        q = ("?" + urllib.parse.urlencode(params)) if params else ""
        with urllib.request.urlopen(self.url + path + q, timeout=10) as resp:
            return bytes(resp.read())

    def flush(self) -> None:
        """Make just-written points queryable (otherwise new series take 5-10 s)."""
        self._get("/internal/force_flush")

    def export(self, match: str) -> list[dict[str, Any]]:
        """Series matching a selector, e.g. ``{__name__=~"pid_.*"}``, as JSON-lines records."""
        self.flush()
        raw = self._get("/api/v1/export", {"match[]": match})
        return [json.loads(line) for line in raw.decode().splitlines() if line.strip()]

    def wait_export(
        self, match: str, min_points: int = 1, timeout_s: float = 20.0
    ) -> list[dict[str, Any]]:
        """Poll ``export`` until at least ``min_points`` values exist in total (bounded)."""
        deadline = time.monotonic() + timeout_s
        series: list[dict[str, Any]] = []
        while time.monotonic() < deadline:
            series = self.export(match)
            if sum(len(s.get("values", [])) for s in series) >= min_points:
                return series
            time.sleep(0.2)
        return series


@fresh_ports_on_clash
def start_victoria(tmp: Path) -> VictoriaMetrics:
    binary = require_binary("victoria-metrics", "victoria-metrics")
    port = free_port()
    data = tmp / "vm-data"
    data.mkdir(parents=True, exist_ok=True)
    argv = [
        binary,
        f"-httpListenAddr=127.0.0.1:{port}",
        f"-storageDataPath={data}",
        "-search.latencyOffset=0s",
        "-loggerLevel=WARN",
        # The default retention (1 month) silently drops points with older timestamps, such as
        # those of a FakeClock: keep everything.
        "-retentionPeriod=100y",
    ]
    srv = VictoriaMetrics(argv=argv, port=port, log_path=tmp / "vm.log", data_dir=data)
    srv.start()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            if srv._get("/health").strip() == b"OK":
                break
        except (urllib.error.URLError, ConnectionError):
            time.sleep(0.05)
    return srv


@dataclass
class InfluxDB1(ServerProcess):
    """A private InfluxDB 1.x (Debian ``influxdb``, 1.6.7): the real InfluxQL engine of the
    tests. ``url`` for clients; `query` answers InfluxQL."""

    data_dir: Path = field(default_factory=Path)
    auth: tuple[str, str] | None = None  # (user, password) the helpers send (auth-enabled)
    rpc_port: int = 0  # the top-level bind-address (backup/restore RPC); 0: not checked

    def listen_ports(self) -> list[int]:
        return [self.port, *([self.rpc_port] if self.rpc_port else [])]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def query(self, q: str, db: str | None = None, *, epoch: str | None = "ms",
              post: bool = False) -> dict[str, Any]:
        """The JSON answer of ``/query`` (GET; POST for statements that change things, e.g.
        ``CREATE DATABASE``). A statement error is in the answer (``results[i].error``).

        Raises:
            urllib.error.HTTPError: the request itself failed (bad syntax: 400).
        """
        params = {"q": q, **({"db": db} if db else {}), **({"epoch": epoch} if epoch else {})}
        data = urllib.parse.urlencode(params).encode()
        req = (urllib.request.Request(self.url + "/query", data=data, method="POST") if post
               else urllib.request.Request(self.url + "/query?" + data.decode()))
        if self.auth is not None:
            token = base64.b64encode(f"{self.auth[0]}:{self.auth[1]}".encode()).decode()
            req.add_header("Authorization", f"Basic {token}")
        with urllib.request.urlopen(req, timeout=30) as resp:
            out: dict[str, Any] = json.loads(resp.read())
        return out

    def create_database(self, name: str) -> None:
        self.query(f'CREATE DATABASE "{name}"', post=True, epoch=None)

    def wait_ready(self, timeout_s: float = 20.0) -> None:
        """Until ``/ping`` answers 204 (the HTTP port opens before the engine is ready)."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                with urllib.request.urlopen(self.url + "/ping", timeout=2) as resp:
                    if resp.status == 204:
                        return
            except (urllib.error.URLError, ConnectionError):
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"influxd not ready; log:\n{self.log_path.read_text()[-2000:]}")
            time.sleep(0.05)

    def start(self) -> None:
        super().start()
        self.wait_ready()


def influxdb1_config(data: Path, http_port: int, rpc_port: int, auth: bool = False) -> str:
    """influxd 1.x config: loopback HTTP and RPC ports, data under ``data``, no reporting,
    no internal monitor database, no query or HTTP request logs; ``auth``: auth-enabled."""
    return (
        "reporting-disabled = true\n"
        f'bind-address = "127.0.0.1:{rpc_port}"\n'
        "[meta]\n"
        f'  dir = "{data / "meta"}"\n'
        "[data]\n"
        f'  dir = "{data / "data"}"\n'
        f'  wal-dir = "{data / "wal"}"\n'
        "  query-log-enabled = false\n"
        "[http]\n"
        f'  bind-address = "127.0.0.1:{http_port}"\n'
        "  log-enabled = false\n"
        f"  auth-enabled = {'true' if auth else 'false'}\n"
        "[logging]\n"
        '  level = "warn"\n'
        "[monitor]\n"
        "  store-enabled = false\n"
        "[continuous_queries]\n"
        "  enabled = false\n"
    )


@fresh_ports_on_clash
def start_influxdb1(tmp: Path, admin: tuple[str, str] | None = None) -> InfluxDB1:
    """A private influxd (Debian ``influxdb``) on free loopback ports (HTTP and RPC), its
    config and data under ``tmp``; ready (``/ping``) when this returns. Stop and start it
    again for outages (same ports, same data). ``admin`` (user, password): auth-enabled, with
    that admin user created (the first user may be created without credentials) and used by
    the helpers."""
    binary = require_binary("influxd", "influxdb")
    port, rpc = free_port(), free_port()
    data = tmp / "influxdb1"
    data.mkdir(parents=True, exist_ok=True)
    conf = tmp / "influxdb.conf"
    conf.write_text(influxdb1_config(data, port, rpc, auth=admin is not None))
    srv = InfluxDB1(argv=[binary, "-config", str(conf)], port=port,
                    log_path=tmp / "influxdb.log", data_dir=data, rpc_port=rpc)
    srv.start()
    if admin is not None:
        srv.query(f"CREATE USER \"{admin[0]}\" WITH PASSWORD '{admin[1]}' WITH ALL PRIVILEGES",
                  post=True, epoch=None)
        srv.auth = admin
    return srv


# --- NATS JetStream cluster (Debian ``nats-server``, 2.9.10) ------------------------------------


@dataclass
class NatsNode(ServerProcess):
    """One node of a private NATS cluster: client ``port``, route ``cluster_port``, MQTT
    listener ``mqtt_port``, HTTP monitoring ``monitor_port``, JetStream files under
    ``store_dir``. `pause`/`resume` send SIGSTOP/SIGCONT (a hung node: its clients are not
    disconnected, TEST-SERVERS.md); `kill` is SIGKILL (no clean shutdown)."""

    name: str = ""
    cluster_port: int = 0
    mqtt_port: int = 0
    monitor_port: int = 0
    store_dir: Path = field(default_factory=Path)
    paused: bool = False

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def pause(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGSTOP)
            self.paused = True

    def resume(self) -> None:
        if self.proc is not None and self.proc.poll() is None and self.paused:
            self.proc.send_signal(signal.SIGCONT)
        self.paused = False

    def kill(self) -> None:
        self.resume()
        self.stop(signal.SIGKILL)

    def stop(self, sig: int = signal.SIGTERM) -> None:
        self.resume()  # a stopped process would not act on SIGTERM
        super().stop(sig)

    def listen_ports(self) -> list[int]:
        return [self.port, self.cluster_port, self.mqtt_port, self.monitor_port]

    def jsz(self, query: str = "") -> dict[str, Any]:
        """This node's JetStream monitoring answer (``/jsz?query``)."""
        url = f"http://127.0.0.1:{self.monitor_port}/jsz" + (f"?{query}" if query else "")
        with urllib.request.urlopen(url, timeout=2) as resp:
            out: dict[str, Any] = json.loads(resp.read())
        return out


def nats_node_config(node: NatsNode, cluster_name: str, routes: list[int],
                     extra_conf: str = "") -> str:
    """nats-server config of one cluster node (TEST-SERVERS.md): loopback listeners for
    clients, routes, MQTT and monitoring; JetStream under the node's own store directory;
    ``extra_conf`` appended (e.g. ``include /abs/path/authorization.conf``)."""
    route_urls = ", ".join(f"nats-route://127.0.0.1:{p}" for p in routes)
    return (
        f"server_name: {node.name}\n"
        f"listen: 127.0.0.1:{node.port}\n"
        f"http: 127.0.0.1:{node.monitor_port}\n"
        f'jetstream {{ store_dir: "{node.store_dir}" }}\n'
        f"cluster {{ name: {cluster_name}, listen: 127.0.0.1:{node.cluster_port}, "
        f"routes: [{route_urls}] }}\n"
        f"mqtt {{ listen: 127.0.0.1:{node.mqtt_port} }}\n"
        + (extra_conf + "\n" if extra_conf else "")
    )


@dataclass
class NatsCluster:
    """A private 3-node NATS JetStream cluster (routes between all nodes, a store directory
    per node, the MQTT 3.1.1 listener on each). ``urls`` for clients (all three nodes).

    Kill, pause and restart single nodes with the `NatsNode` methods (``cluster.nodes[i]`` or
    `node`); `stream_leader` names the node leading a stream (a KV bucket ``B`` is the stream
    ``KV_B``); `wait_meta_leader` / `wait_stream_leader` wait (bounded) for an election.
    """

    nodes: list[NatsNode]

    @property
    def urls(self) -> list[str]:
        return [n.url for n in self.nodes]

    def node(self, name: str) -> NatsNode:
        """The node called ``name``.

        Raises:
            KeyError: no node of that name.
        """
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(name)

    def _ask(self, query: str = "") -> list[dict[str, Any]]:
        answers = []
        for n in self.nodes:
            if not n.running or n.paused:
                continue
            try:
                answers.append(n.jsz(query))
            except (OSError, ValueError):  # a paused or starting node does not answer
                continue
        return answers

    def meta_leader(self) -> str | None:
        """The JetStream meta leader's name as a running node reports it, or None."""
        for d in self._ask():
            leader = (d.get("meta_cluster") or {}).get("leader")
            if leader:
                return str(leader)
        return None

    def stream_leader(self, stream: str) -> str | None:
        """The leader of ``stream`` (KV bucket ``B`` = stream ``KV_B``) as a running node
        reports it, or None (no leader now, or no such stream)."""
        for d in self._ask("accounts=true&streams=true"):
            for acc in d.get("account_details") or []:
                for s in acc.get("stream_detail") or []:
                    leader = (s.get("cluster") or {}).get("leader")
                    if s.get("name") == stream and leader:
                        return str(leader)
        return None

    def wait_meta_leader(self, exclude: str | None = None, timeout_s: float = 30.0) -> str:
        """Until a running, unpaused node reports a JetStream meta leader other than
        ``exclude``; its name.

        Raises:
            TimeoutError: none within ``timeout_s``.
        """
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            leader = self.meta_leader()
            if leader and leader != exclude:
                return leader
            time.sleep(0.05)
        raise TimeoutError(f"no JetStream meta leader (other than {exclude}) after {timeout_s} s")

    def formed(self) -> str | None:
        """The meta leader's name when every node runs, reports that leader, and the leader
        reports every other node as a current meta-group peer; else None. (A leader elected
        before its peers are current refused a 3-replica KV bucket, "no suitable peers":
        BadRequestError, on a loaded host.)"""
        if not all(n.running and not n.paused for n in self.nodes):
            return None
        try:
            metas = {n.name: n.jsz().get("meta_cluster") or {} for n in self.nodes}
        except (OSError, ValueError):
            return None
        leaders = {m.get("leader") for m in metas.values()}
        if len(leaders) != 1:
            return None
        leader = leaders.pop()
        if leader not in metas:
            return None
        current = {r.get("name") for r in metas[leader].get("replicas") or []
                   if r.get("current")}
        return str(leader) if current >= set(metas) - {leader} else None

    def wait_formed(self, timeout_s: float = 30.0) -> str:
        """Until `formed`; the meta leader's name.

        Raises:
            TimeoutError: not formed within ``timeout_s``.
        """
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            leader = self.formed()
            if leader:
                return leader
            time.sleep(0.05)
        raise TimeoutError(f"the NATS cluster did not form (a leader and every peer current) "
                           f"within {timeout_s} s")

    def wait_joined(self, name: str, timeout_s: float = 30.0) -> None:
        """Until node ``name`` (restarted) itself reports the cluster's meta leader.

        Raises:
            TimeoutError: it does not within ``timeout_s``.
        """
        node = self.node(name)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                if (node.jsz().get("meta_cluster") or {}).get("leader"):
                    return
            except (OSError, ValueError):
                pass
            time.sleep(0.05)
        raise TimeoutError(f"node {name} did not rejoin within {timeout_s} s")

    def wait_stream_leader(self, stream: str, exclude: str | None = None,
                           timeout_s: float = 30.0) -> str:
        """Until ``stream`` has a leader other than ``exclude``; its name.

        Raises:
            TimeoutError: none within ``timeout_s``.
        """
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            leader = self.stream_leader(stream)
            if leader and leader != exclude:
                return leader
            time.sleep(0.05)
        raise TimeoutError(f"no leader of stream {stream} after {timeout_s} s")

    def stop(self) -> None:
        for n in self.nodes:
            n.stop()


@fresh_ports_on_clash
def start_nats_cluster(tmp: Path, size: int = 3, cluster_name: str = "rackplane-test",
                       extra_conf: str = "") -> NatsCluster:
    """A private NATS JetStream cluster of ``size`` nodes (Debian ``nats-server``) on free
    loopback ports, config, logs and stores under ``tmp``; ready (a JetStream meta leader
    elected, every node following it and current: `NatsCluster.formed`) when this returns.
    ``extra_conf`` is appended to every node's config (an ``include`` of an authorization
    block: config/nats/).

    Raises:
        ServerMissing: nats-server is not installed.
        RuntimeError / TimeoutError: a node did not start, or no meta leader was elected.
    """
    binary = require_binary("nats-server", "nats-server")
    nodes = []
    for i in range(size):
        store = tmp / f"n{i}-store"
        store.mkdir(parents=True, exist_ok=True)
        nodes.append(NatsNode(argv=[], port=free_port(), log_path=tmp / f"n{i}.log",
                              name=f"n{i}", cluster_port=free_port(), mqtt_port=free_port(),
                              monitor_port=free_port(), store_dir=store))
    routes = [n.cluster_port for n in nodes]
    for n in nodes:
        conf = tmp / f"{n.name}.conf"
        conf.write_text(nats_node_config(n, cluster_name, routes, extra_conf))
        n.argv = [binary, "-c", str(conf)]
    cluster = NatsCluster(nodes)
    try:
        for n in nodes:
            n.start()
        cluster.wait_formed()
    except BaseException:
        cluster.stop()
        raise
    return cluster
