"""A private Mosquitto running the shipped production configuration (config/mosquitto/):
``mosquitto.conf`` and ``rackplane.acl`` as they are, with only the port, the file paths and
the ``user`` line substituted, plus a throwaway CA, server certificate and password file made
at test time.

Certificates come from the ``openssl`` command line (the ``cryptography`` package is not a
dependency; ``openssl`` ships with every Debian). EC P-256 keys: each takes milliseconds.

The ``user`` line. Mosquitto 2.0 started as root drops to ``user`` (default ``mosquitto``)
*before* it reads certificates, keys, the password file and the ACL (measured with 2.0.11:
"Error: Unable to open pwfile" for a file in pytest's private temporary folder, which is
``/tmp/pytest-of-root``, mode 0700). The clean fix is not to weaken that folder's mode or
chown files to another user, but to run the test broker as the user running the tests:
``user <that user>`` (for root that is ``user root``, which Mosquitto documents as "do not
change user"; for anyone else the line has no effect). Production keeps ``user mosquitto``
and root:mosquitto 0640 files (config/mosquitto/mosquitto.conf).
"""

from __future__ import annotations

import os
import pwd
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from harness.servers import Mosquitto, free_port, fresh_ports_on_clash
from tests.servers import require_binary

ROOT = Path(__file__).resolve().parents[2]
SHIPPED_CONF = ROOT / "config" / "mosquitto" / "mosquitto.conf"
SHIPPED_ACL = ROOT / "config" / "mosquitto" / "rackplane.acl"
ETC = "/etc/mosquitto/rackplane/"

# The users of the shipped ACL: daemons, operators/automation (own cmd level), a reader.
USERS = {"valvey": "pw-valvey", "racky": "pw-racky", "alice": "pw-alice", "bms": "pw-bms",
         "rita": "pw-rita"}


def _run(argv: list[str], cwd: Path) -> None:
    proc = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=30)
    if proc.returncode != 0:
        raise RuntimeError(f"{argv[0]} failed ({proc.returncode}): {proc.stderr}{proc.stdout}")


def make_ca(d: Path, name: str = "ca") -> tuple[Path, Path]:
    """A self-signed CA (EC P-256, 2 days): (cert, key)."""
    openssl = require_binary("openssl", "openssl")
    _run([openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
          "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.crt", "-days", "2",
          "-subj", f"/CN=rackplane test {name}", "-addext", "basicConstraints=critical,CA:TRUE",
          "-addext", "keyUsage=critical,keyCertSign,cRLSign"], d)
    return d / f"{name}.crt", d / f"{name}.key"


def make_server_cert(d: Path, ca_crt: Path, ca_key: Path) -> tuple[Path, Path]:
    """A server certificate for 127.0.0.1 / localhost signed by the CA: (cert, key)."""
    openssl = require_binary("openssl", "openssl")
    _run([openssl, "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
          "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=localhost"], d)
    (d / "server.ext").write_text(
        "subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=CA:FALSE\n"
        "keyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n")
    _run([openssl, "x509", "-req", "-in", "server.csr", "-CA", str(ca_crt), "-CAkey",
          str(ca_key), "-CAcreateserial", "-out", "server.crt", "-days", "2",
          "-extfile", "server.ext"], d)
    return d / "server.crt", d / "server.key"


def render_conf(shipped: str, *, port: int, directory: Path, run_as: str) -> str:
    """The shipped config with the port, the paths and the user substituted. Each
    substitution must match (a changed shipped config fails here, not silently)."""
    subs = [
        ("listener 8883\n", f"listener {port} 127.0.0.1\n", 1),
        ("persistence_location /var/lib/mosquitto/\n",
         f"persistence_location {directory}/data/\n", 1),
        ("user mosquitto\n", f"user {run_as}\n", 1),
        ("log_dest syslog\n", "log_dest stdout\n", 1),
    ]
    text = shipped
    for old, new, count in subs:
        assert text.count(old) == count, f"shipped mosquitto.conf has no {old.strip()!r}"
        text = text.replace(old, new)
    assert text.count(ETC) >= 5, "shipped mosquitto.conf: files no longer under " + ETC
    return text.replace(ETC, f"{directory}/")


@dataclass
class SecureBroker:
    """The running broker and what clients need."""

    server: Mosquitto
    directory: Path
    ca_file: Path
    passwords: dict[str, str] = field(default_factory=dict)

    @property
    def port(self) -> int:
        return self.server.port

    def log(self) -> str:
        return self.server.log_path.read_text(errors="replace")

    def stop(self) -> None:
        self.server.stop()


@fresh_ports_on_clash
def start_secure_broker(tmp: Path, users: dict[str, str] | None = None) -> SecureBroker:
    """Start Mosquitto with the shipped config on a free loopback port (see the module
    docstring); ``users``: username -> password for the password file."""
    binary = require_binary("mosquitto", "mosquitto")
    passwd = require_binary("mosquitto_passwd", "mosquitto")
    users = dict(USERS if users is None else users)
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "data").mkdir(exist_ok=True)
    ca_crt, ca_key = make_ca(tmp)
    make_server_cert(tmp, ca_crt, ca_key)
    first = True
    for name, password in users.items():
        _run([passwd, *(["-c"] if first else []), "-b", "passwd", name, password], tmp)
        first = False
    (tmp / "acl").write_text(SHIPPED_ACL.read_text())
    port = free_port()
    run_as = pwd.getpwuid(os.geteuid()).pw_name
    conf = tmp / "mosquitto.conf"
    conf.write_text(render_conf(SHIPPED_CONF.read_text(), port=port, directory=tmp,
                                run_as=run_as))
    srv = Mosquitto(argv=[binary, "-c", str(conf)], port=port, log_path=tmp / "mosquitto.log")
    srv.start()
    return SecureBroker(srv, tmp, ca_crt, users)
