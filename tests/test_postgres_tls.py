"""TLS to PostgreSQL (README "PostgreSQL": TLS): libpq's ``sslmode`` and ``sslrootcert``
against the real local server, whose TLS certificate is read from its own settings.

The server of this project's machines has TLS on (Debian's snake-oil certificate, a self-signed
certificate for ``localhost``); a server with TLS off makes the tests that need it skip, and
says so.
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys
from collections.abc import Iterator

import pytest

import fencepost as fp
from tests.conftest import PG_URL, pg_connect, pg_schema


def _server_tls() -> tuple[bool, pathlib.Path]:
    """Whether the server offers TLS, and the path of its certificate."""
    with pg_connect(PG_URL) as conn:
        on, cert, data = conn.execute(
            "SELECT current_setting('ssl'), current_setting('ssl_cert_file'), "
            "current_setting('data_directory')"
        ).fetchone() or ("off", "", "")
    path = pathlib.Path(cert)
    return on == "on", path if path.is_absolute() else pathlib.Path(data) / path


SERVER_TLS, SERVER_CERT = _server_tls()
needs_tls = pytest.mark.skipif(
    not SERVER_TLS, reason="the PostgreSQL server at FENCEPOST_PG_URL has ssl = off"
)


@pytest.fixture
def url() -> Iterator[str]:
    with pg_schema() as u:
        yield u


def _tls(url: str) -> str:
    with fp.Ledger.open(url) as ledger:
        ledger.start_run("wf", scope_key=None, steps=[{"id": "s"}], force=True)
        return str(ledger.pragmas()["tls"])


def test_the_default_is_prefer_tls_when_the_server_offers_it(url: str) -> None:
    tls = _tls(url)
    assert tls.startswith("TLSv1.") if SERVER_TLS else tls == "off"


def test_disable_talks_plaintext(url: str) -> None:
    assert _tls(url + "&sslmode=disable") == "off"


@needs_tls
def test_require_encrypts_without_checking_the_certificate(url: str) -> None:
    assert _tls(url + "&sslmode=require").startswith("TLSv1.")


@needs_tls
def test_verify_ca_accepts_the_servers_own_ca(url: str) -> None:
    # The snake-oil certificate is self-signed: it is its own CA.
    assert _tls(f"{url}&sslmode=verify-ca&sslrootcert={SERVER_CERT}").startswith("TLSv1.")
    # libpq: require with a root certificate checks the chain like verify-ca.
    assert _tls(f"{url}&sslmode=require&sslrootcert={SERVER_CERT}").startswith("TLSv1.")


@needs_tls
def test_verify_full_checks_the_host_name(url: str) -> None:
    # The certificate names localhost, not 127.0.0.1: verify-full refuses the address...
    at_ip = url.replace("@localhost:", "@127.0.0.1:")
    with pytest.raises(fp.StoreError) as err:
        fp.Ledger.open(f"{at_ip}&sslmode=verify-full&sslrootcert={SERVER_CERT}")
    message = str(err.value)
    assert "127.0.0.1" in message
    assert "certificate" in message
    assert "sslrootcert" in message
    # ... and accepts the name the certificate was issued for.
    at_name = url.replace("@127.0.0.1:", "@localhost:")
    assert _tls(f"{at_name}&sslmode=verify-full&sslrootcert={SERVER_CERT}").startswith("TLSv1.")


@needs_tls
def test_a_certificate_from_another_ca_is_refused(url: str) -> None:
    others = [
        p
        for p in sorted(pathlib.Path("/etc/ssl/certs").glob("*.pem"))
        if p.resolve() != SERVER_CERT.resolve()
    ]
    if not others:
        pytest.skip("no CA certificate other than the server's under /etc/ssl/certs")
    with pytest.raises(fp.StoreError) as err:
        fp.Ledger.open(f"{url}&sslmode=verify-ca&sslrootcert={others[0]}")
    assert "certificate" in str(err.value)
    assert "sslrootcert" in str(err.value)


@pytest.mark.parametrize(
    ("query", "says"),
    [
        ("sslmode=allow", "sslmode=allow is not supported"),
        ("sslmode=verify-full", "need sslrootcert"),
        ("sslmode=verify-ca&sslrootcert=/nonexistent/ca.pem", "/nonexistent/ca.pem"),
    ],
)
def test_bad_tls_settings_are_invalid_arguments(url: str, query: str, says: str) -> None:
    with pytest.raises(fp.InvalidArgument) as err:
        fp.Ledger.open(f"{url}&{query}")
    assert err.value.argument == "target"
    assert says in str(err.value)
    # Refused before connecting: the schema was never created.
    with pg_connect(PG_URL) as conn:
        schema = url.rsplit("schema=", 1)[1]
        found = conn.execute(
            "SELECT count(*) FROM information_schema.schemata WHERE schema_name = %s", (schema,)
        ).fetchone()
        assert found == (0,)


@needs_tls
def test_a_root_file_path_may_be_percent_encoded(url: str, tmp_path: pathlib.Path) -> None:
    odd = tmp_path / "ca dir&x" / "root.pem"
    odd.parent.mkdir()
    odd.write_bytes(SERVER_CERT.read_bytes())
    encoded = str(odd).replace("%", "%25").replace(" ", "%20").replace("&", "%26")
    assert _tls(f"{url}&sslmode=verify-ca&sslrootcert={encoded}").startswith("TLSv1.")


def test_doctor_shows_the_connections_tls(url: str) -> None:
    # `fencepost doctor` against PostgreSQL, as a user runs it: the TLS line says what the
    # connection negotiated, and plaintext says off; SQLite's doctor has no such line.
    _tls(url)  # creates the ledger in the schema
    for query, expect in [("", "TLSv1." if SERVER_TLS else "off"), ("&sslmode=disable", "off")]:
        done = subprocess.run(
            [sys.executable, "-m", "fencepost", "doctor", "--db", url + query],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        line = next(x for x in done.stdout.splitlines() if x.startswith("tls "))
        assert line.split()[-1].startswith(expect), line
        report = subprocess.run(
            [sys.executable, "-m", "fencepost", "doctor", "--json", "--db", url + query],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        assert json.loads(report.stdout)["pragmas"]["tls"].startswith(expect)
