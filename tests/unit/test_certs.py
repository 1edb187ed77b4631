"""labrunner.certs (scripts/gen_certs.py): SANs, a verifiable chain, private keys, idempotence."""

import contextlib
import ipaddress
import ssl
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from labrunner import certs as lab_certs

from services.common.stacks import STACKS


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("certs")
    assert lab_certs.ensure_certs(directory) is True
    return directory


def _cert(directory: Path, name: str) -> x509.Certificate:
    return x509.load_pem_x509_certificate((directory / name).read_bytes())


def test_server_certificate_has_every_lab_san(certs: Path) -> None:
    sans = _cert(certs, "server.pem").extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    # Each declared stack's compose service, named as compose names it: its package with dashes.
    compose_names = {stack.package.replace("_", "-") for stack in STACKS}
    assert set(sans.get_values_for_type(x509.DNSName)) == {"localhost", *compose_names}
    assert set(sans.get_values_for_type(x509.IPAddress)) == {
        ipaddress.ip_address("127.0.0.1"),
        ipaddress.ip_address("::1"),
        ipaddress.ip_address("198.18.0.1"),  # the service's end of a network scenario's link
    }


def test_chain_verifies_in_a_real_tls_handshake(certs: Path) -> None:
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(certs / "server.pem", certs / "server-key.pem")
    for name in ("localhost", "grpc-aio", "127.0.0.1"):
        client_ctx = ssl.create_default_context(cafile=str(certs / "ca.pem"))
        client_in, client_out, server_in, server_out = (ssl.MemoryBIO() for _ in range(4))
        client = client_ctx.wrap_bio(client_in, client_out, server_hostname=name)
        server = server_ctx.wrap_bio(server_in, server_out, server_side=True)
        for _ in range(10):  # pump the handshake between the two in-memory ends
            for side in (client, server):
                with contextlib.suppress(ssl.SSLWantReadError):
                    side.do_handshake()
            server_in.write(client_out.read())
            client_in.write(server_out.read())
        client.do_handshake()  # raises SSLCertVerificationError if the chain or name is wrong
        assert client.getpeercert()["subject"] == ((("commonName", "localhost"),),)


def test_a_foreign_ca_does_not_verify(certs: Path, tmp_path: Path) -> None:
    lab_certs.generate(tmp_path)
    _cert(certs, "server.pem").verify_directly_issued_by(_cert(certs, "ca.pem"))
    with pytest.raises(InvalidSignature):
        _cert(certs, "server.pem").verify_directly_issued_by(_cert(tmp_path, "ca.pem"))


def test_private_keys_are_not_world_readable(certs: Path) -> None:
    for name in ("ca-key.pem", "server-key.pem"):
        assert (certs / name).stat().st_mode & 0o777 == 0o600, name
    for name in ("ca.pem", "server.pem"):
        assert (certs / name).stat().st_mode & 0o777 == 0o644, name


def test_valid_certificates_are_kept_and_broken_ones_replaced(tmp_path: Path) -> None:
    assert lab_certs.ensure_certs(tmp_path) is True
    before = (tmp_path / "server.pem").read_bytes()
    (tmp_path / "server-key.pem").chmod(0o644)
    assert lab_certs.ensure_certs(tmp_path) is False
    assert (tmp_path / "server.pem").read_bytes() == before
    assert (tmp_path / "server-key.pem").stat().st_mode & 0o777 == 0o600  # permissions repaired
    (tmp_path / "ca.pem").unlink()
    assert lab_certs.problem(tmp_path) == "ca.pem is missing"
    assert lab_certs.ensure_certs(tmp_path) is True
    assert lab_certs.problem(tmp_path) is None
    assert lab_certs.ensure_certs(tmp_path, force=True) is True
    assert (tmp_path / "server.pem").read_bytes() != before


def test_mismatched_files_are_detected(tmp_path: Path) -> None:
    first, second = tmp_path / "a", tmp_path / "b"
    lab_certs.generate(first)
    lab_certs.generate(second)
    (first / "ca.pem").write_bytes((second / "ca.pem").read_bytes())
    assert lab_certs.problem(first) == "server.pem is not signed by ca.pem"


def test_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert lab_certs.main(["--dir", str(tmp_path)]) == 0
    assert "generated CA and server certificate" in capsys.readouterr().out
    assert lab_certs.main(["--dir", str(tmp_path)]) == 0
    assert "kept the valid certificates" in capsys.readouterr().out


def test_no_ca_key_signs_then_keeps_no_key_and_a_new_name_makes_a_new_ca(tmp_path: Path) -> None:
    """compose's one-shot (--no-ca-key): the shared volume every service mounts never holds the CA key."""
    assert lab_certs.main(["--dir", str(tmp_path), "--no-ca-key"]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ca.pem", "server-key.pem", "server.pem"]
    assert lab_certs.problem(tmp_path) is None  # still a valid set: the server certificate verifies
    first_ca = (tmp_path / "ca.pem").read_bytes()
    assert lab_certs.ensure_certs(tmp_path, keep_ca_key=False) is False  # kept as it is
    # A name the certificate lacks cannot be signed without the key: a new CA signs it.
    assert lab_certs.ensure_certs(tmp_path, extra=["10.0.0.5"], keep_ca_key=False) is True
    assert (tmp_path / "ca.pem").read_bytes() != first_ca
    assert not (tmp_path / "ca-key.pem").exists()
    assert lab_certs.problem(tmp_path, ["10.0.0.5"]) is None
    # A volume an older compose file filled, key included: the key goes, the certificates stay.
    assert lab_certs.ensure_certs(tmp_path, force=True) is True
    assert (tmp_path / "ca-key.pem").exists()
    ca = (tmp_path / "ca.pem").read_bytes()
    assert lab_certs.main(["--dir", str(tmp_path), "--no-ca-key"]) == 0
    assert not (tmp_path / "ca-key.pem").exists() and (tmp_path / "ca.pem").read_bytes() == ca
