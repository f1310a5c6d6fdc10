"""Steps on two hosts through Dagster's Celery executor, one host cut off mid-step.

Hosts A and B are network namespaces, each joined to this machine by a veth pair, each running
one ``bin/prod worker``. This machine runs ``bin/prod`` (webserver, daemon, the runs' own
processes), a private PostgreSQL server (the store and the Dagster instance) listening on both
links and on loopback, the provider simulator on every address, and a TCP forward from each
link to the machine's RabbitMQ (which listens on loopback only): every worker reaches the
broker, the store, the instance and the model over its link. A backfill of two tenants is
launched through GraphQL; once each worker runs one tenant's labels step, one worker's link
goes down (``ip link set ... down`` in its namespace: no process killed, no FIN or RST sent).

Shown, with ``BACKFILL_PG_DEAD_PEER_SECONDS`` at 3 s (broker heartbeat 10 s): RabbitMQ gives
the cut-off worker's step to the other host once the heartbeats stop, PostgreSQL has freed
the partition's lock by then, the backfill completes on the other host, every partition is
applied once, and the ledger equals the simulator's meter but for the calls in flight at the
cut, which are all that is re-paid. The figures print with ``-s``.

Needs root (namespaces), PostgreSQL's server binaries and RabbitMQ with ``rabbitmqctl``;
skipped with the reason without them, except under CI=true, where it must run.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import sqlalchemy as sa

from backfill_assets.providersim import SimConfig, Simulator
from backfill_tests.cli_runs import clear_settings
from backfill_tests.conftest import IN_CI
from backfill_tests.drills.test_celery_workers import (
    BROKER,
    LATENCY_MS,
    Cluster,
    celery_env,
    check_outcome,
    run_drill,
    vhost,
)
from backfill_tests.drills.test_celery_workers import _unavailable as _no_broker
from backfill_tests.drills.test_host_cut import _ip, _pg_bin, _pick_subnet
from backfill_tests.drills.test_host_cut import _unavailable as _no_namespaces
from backfill_tests.drills.test_prod_daemon import prod_env

__all__ = ["vhost"]  # the fixture, shared with the one-host Celery drill

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("servers")]


@dataclass
class Link:
    """One host: a namespace, its end of the veth, and the addresses of both ends."""

    ns: str
    veth_ns: str
    veth_root: str
    root_ip: str
    ns_ip: str

    def on(self, argv: list[str]) -> list[str]:
        return ["ip", "netns", "exec", self.ns, *argv]

    def cut(self) -> None:
        _ip("-n", self.ns, "link", "set", self.veth_ns, "down")


@dataclass
class Hosts:
    links: dict[str, Link]
    pg_port: int
    workdir: Path

    def url(self, db: str, host: str = "127.0.0.1", driver: str = "+psycopg2") -> str:
        return f"postgresql{driver}://postgres@{host}:{self.pg_port}/{db}"


def _add_link(name: str, tag: str) -> Link:
    ns, veth_root, veth_ns = f"bf{name}{tag}", f"bfr{name}{tag}", f"bfn{name}{tag}"
    root_ip, ns_ip = _pick_subnet()
    _ip("netns", "add", ns)
    _ip("link", "add", veth_root, "type", "veth", "peer", "name", veth_ns)
    _ip("link", "set", veth_ns, "netns", ns)
    _ip("addr", "add", f"{root_ip}/30", "dev", veth_root)
    _ip("link", "set", veth_root, "up")
    _ip("-n", ns, "addr", "add", f"{ns_ip}/30", "dev", veth_ns)
    _ip("-n", ns, "link", "set", veth_ns, "up")
    _ip("-n", ns, "link", "set", "lo", "up")
    return Link(ns, veth_ns, veth_root, root_ip, ns_ip)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def hosts() -> Iterator[Hosts]:
    reason = _no_namespaces() or _no_broker()
    if reason is not None:
        if IN_CI:
            pytest.fail(f"CI=true but the Celery host drill cannot run: {reason}")
        pytest.skip(reason)
    pg_bin = _pg_bin()
    assert pg_bin is not None
    tag = uuid.uuid4().hex[:5]
    workdir = Path(tempfile.mkdtemp(prefix="bf-celery-hosts-"))
    data = workdir / "pg"
    as_pg = ["runuser", "-u", "postgres", "--"]
    links: dict[str, Link] = {}
    started_pg = False
    try:
        for name in ("a", "b"):
            links[name] = _add_link(name, tag)
        shutil.chown(workdir, "postgres", "postgres")
        os.chmod(workdir, 0o755)  # the workers' logs and homes live here too
        initdb = [str(pg_bin / "initdb"), "-D", str(data), "-A", "trust", "-U", "postgres"]
        subprocess.run(
            [*as_pg, *initdb, "--no-sync", "-E", "UTF8", "--locale=C"],
            check=True,
            capture_output=True,
        )
        with (data / "pg_hba.conf").open("a") as hba:
            for link in links.values():
                hba.write(f"host all all {link.root_ip}/30 trust\n")
        port = _free_port()
        listen = ",".join(["127.0.0.1", *(link.root_ip for link in links.values())])
        opts = (
            f"-c listen_addresses={listen} -p {port} -k {workdir} -c fsync=off"
            " -c synchronous_commit=off -c full_page_writes=off -c max_connections=300"
        )
        pg_ctl = [str(pg_bin / "pg_ctl"), "-D", str(data), "-l", str(workdir / "pg.log")]
        subprocess.run(
            [*as_pg, *pg_ctl, "-o", opts, "-w", "-t", "60", "start"],
            check=True,
            capture_output=True,
        )
        started_pg = True
        yield Hosts(links, port, workdir)
    finally:
        for link in links.values():
            pids = subprocess.run(["ip", "netns", "pids", link.ns], capture_output=True, text=True)
            for pid in pids.stdout.split():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid), 9)
        if started_pg:
            subprocess.run(
                [*as_pg, str(pg_bin / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop"],
                capture_output=True,
            )
        for link in links.values():
            subprocess.run(["ip", "netns", "del", link.ns], capture_output=True)
            subprocess.run(["ip", "link", "del", link.veth_root], capture_output=True)
        shutil.rmtree(workdir, ignore_errors=True)


class Forward:
    """A TCP forward from ``listen`` to ``target``, a thread per direction per connection:
    the namespaces' way to the broker, which listens on loopback only. AMQP heartbeats pass
    through, so the broker still sees a cut-off worker go silent."""

    def __init__(self, host: str, target: tuple[str, int]) -> None:
        self.target = target
        self.sock = socket.create_server((host, 0))
        self.sock.settimeout(0.2)
        self.port = int(self.sock.getsockname()[1])
        self.open: list[socket.socket] = []
        self.stopped = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.stopped.is_set():
            try:
                near, _addr = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            far = socket.create_connection(self.target)
            self.open += [near, far]
            for src, dst in ((near, far), (far, near)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                dst.sendall(data)
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def stop(self) -> None:
        self.stopped.set()
        self.sock.close()
        for s in self.open:
            with contextlib.suppress(OSError):
                s.close()


def test_steps_on_two_hosts_one_cut_off_mid_step(
    hosts: Hosts, vhost: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    admin = sa.create_engine(hosts.url("postgres"), isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        for db in ("bf_dagster", "bf_store"):
            conn.execute(sa.text(f'CREATE DATABASE "{db}"'))
    admin.dispose()
    home, port = hosts.workdir / "home", _free_port()
    sim = Simulator(SimConfig(latency_median_ms=LATENCY_MS), host="0.0.0.0").start()
    forwards = {name: Forward(link.root_ip, BROKER) for name, link in hosts.links.items()}
    try:
        broker = f"pyamqp://guest:guest@{BROKER[0]}:{BROKER[1]}/{vhost}"
        model = f"http://127.0.0.1:{sim.port}/v1"
        root = prod_env(hosts.url("bf_dagster"), hosts.url("bf_store", driver=""), home, port)
        env = celery_env(root, broker, model)
        workers = {}
        for name, link in hosts.links.items():
            # The same settings, every address the one of this host's link.
            at = link.root_ip
            on_link = prod_env(
                hosts.url("bf_dagster", at), hosts.url("bf_store", at, driver=""), home, port
            )
            broker_here = f"pyamqp://guest:guest@{at}:{forwards[name].port}/{vhost}"
            model_here = f"http://{at}:{sim.port}/v1"
            workers[name] = (link.on([]), celery_env(on_link, broker_here, model_here))
        clear_settings(monkeypatch)
        monkeypatch.setenv("DAGSTER_PG_URL", env["DAGSTER_PG_URL"])
        c = Cluster(
            env, workers, home, env["BACKFILL_DATABASE_URL"], f"http://127.0.0.1:{port}",
            hosts.workdir,
        )  # fmt: skip
        found = run_drill(c, sim, lambda name, _proc: hosts.links[name].cut())
    finally:
        for forward in forwards.values():
            forward.stop()
        sim.stop()
    check_outcome(c, found, "celery host cut")
