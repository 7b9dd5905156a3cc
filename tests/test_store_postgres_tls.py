"""TLS to PostgreSQL (README "PostgreSQL": TLS): libpq's ``sslmode`` and ``sslrootcert``
against the real local server, whose TLS certificate is read from its own settings.

The server of this project's machines has TLS on (Debian's snake-oil certificate, a self-signed
certificate for ``localhost``); on a developer's server with TLS off the tests that need it
skip and say so, and under CI they run (and fail) instead.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
from collections.abc import Iterator

import pytest

import fencepost as fp
from tests.conftest import PG_URL, pg_connect, pg_schema, schema_of


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
# A developer's own server may have TLS off; CI's (this project's machines, Debian's
# PostgreSQL) has it on, so under CI these tests never skip: they run, and fail if it is off.
needs_tls = pytest.mark.skipif(
    not SERVER_TLS and not os.environ.get("CI"),
    reason="the PostgreSQL server at FENCEPOST_PG_URL has ssl = off (under CI this fails instead)",
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


# A CA that did not sign the local server's certificate: Let's Encrypt's public root (a
# public certificate, shipped here so the test does not depend on the machine's CA store).
ANOTHER_CA = """\
-----BEGIN CERTIFICATE-----
MIIFazCCA1OgAwIBAgIRAIIQz7DSQONZRGPgu2OCiwAwDQYJKoZIhvcNAQELBQAw
TzELMAkGA1UEBhMCVVMxKTAnBgNVBAoTIEludGVybmV0IFNlY3VyaXR5IFJlc2Vh
cmNoIEdyb3VwMRUwEwYDVQQDEwxJU1JHIFJvb3QgWDEwHhcNMTUwNjA0MTEwNDM4
WhcNMzUwNjA0MTEwNDM4WjBPMQswCQYDVQQGEwJVUzEpMCcGA1UEChMgSW50ZXJu
ZXQgU2VjdXJpdHkgUmVzZWFyY2ggR3JvdXAxFTATBgNVBAMTDElTUkcgUm9vdCBY
MTCCAiIwDQYJKoZIhvcNAQEBBQADggIPADCCAgoCggIBAK3oJHP0FDfzm54rVygc
h77ct984kIxuPOZXoHj3dcKi/vVqbvYATyjb3miGbESTtrFj/RQSa78f0uoxmyF+
0TM8ukj13Xnfs7j/EvEhmkvBioZxaUpmZmyPfjxwv60pIgbz5MDmgK7iS4+3mX6U
A5/TR5d8mUgjU+g4rk8Kb4Mu0UlXjIB0ttov0DiNewNwIRt18jA8+o+u3dpjq+sW
T8KOEUt+zwvo/7V3LvSye0rgTBIlDHCNAymg4VMk7BPZ7hm/ELNKjD+Jo2FR3qyH
B5T0Y3HsLuJvW5iB4YlcNHlsdu87kGJ55tukmi8mxdAQ4Q7e2RCOFvu396j3x+UC
B5iPNgiV5+I3lg02dZ77DnKxHZu8A/lJBdiB3QW0KtZB6awBdpUKD9jf1b0SHzUv
KBds0pjBqAlkd25HN7rOrFleaJ1/ctaJxQZBKT5ZPt0m9STJEadao0xAH0ahmbWn
OlFuhjuefXKnEgV4We0+UXgVCwOPjdAvBbI+e0ocS3MFEvzG6uBQE3xDk3SzynTn
jh8BCNAw1FtxNrQHusEwMFxIt4I7mKZ9YIqioymCzLq9gwQbooMDQaHWBfEbwrbw
qHyGO0aoSCqI3Haadr8faqU9GY/rOPNk3sgrDQoo//fb4hVC1CLQJ13hef4Y53CI
rU7m2Ys6xt0nUW7/vGT1M0NPAgMBAAGjQjBAMA4GA1UdDwEB/wQEAwIBBjAPBgNV
HRMBAf8EBTADAQH/MB0GA1UdDgQWBBR5tFnme7bl5AFzgAiIyBpY9umbbjANBgkq
hkiG9w0BAQsFAAOCAgEAVR9YqbyyqFDQDLHYGmkgJykIrGF1XIpu+ILlaS/V9lZL
ubhzEFnTIZd+50xx+7LSYK05qAvqFyFWhfFQDlnrzuBZ6brJFe+GnY+EgPbk6ZGQ
3BebYhtF8GaV0nxvwuo77x/Py9auJ/GpsMiu/X1+mvoiBOv/2X/qkSsisRcOj/KK
NFtY2PwByVS5uCbMiogziUwthDyC3+6WVwW6LLv3xLfHTjuCvjHIInNzktHCgKQ5
ORAzI4JMPJ+GslWYHb4phowim57iaztXOoJwTdwJx4nLCgdNbOhdjsnvzqvHu7Ur
TkXWStAmzOVyyghqpZXjFaH3pO3JLF+l+/+sKAIuvtd7u+Nxe5AW0wdeRlN8NwdC
jNPElpzVmbUq4JUagEiuTDkHzsxHpFKVK7q4+63SM1N95R1NbdWhscdCb+ZAJzVc
oyi3B43njTOQ5yOf+1CceWxG1bQVs5ZufpsMljq4Ui0/1lvh+wjChP4kqKOJ2qxq
4RgqsahDYVvTH9w7jXbyLeiNdd8XM2w9U/t7y0Ff/9yi0GE44Za4rF2LN9d11TPA
mRGunUHBcnWEvgJBQl9nJEiU0Zsnvgc/ubhPgXRR4Xq37Z0j4r7g1SgEEzwxA57d
emyPxgcYxn/eR44/KJ4EBs+lVDR3veyJm+kXQ99b21/+jh5Xos1AnX5iItreGCc=
-----END CERTIFICATE-----
"""


@needs_tls
def test_a_certificate_from_another_ca_is_refused(url: str, tmp_path: pathlib.Path) -> None:
    other = tmp_path / "another-ca.pem"
    other.write_text(ANOTHER_CA)
    with pytest.raises(fp.StoreError) as err:
        fp.Ledger.open(f"{url}&sslmode=verify-ca&sslrootcert={other}")
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
        schema = schema_of(url)
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
