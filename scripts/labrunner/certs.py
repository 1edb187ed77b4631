"""Generate the lab CA and a server certificate for every TLS target into certs/ (never committed).

The services present certs/server.pem; k6, the verifier and the tests trust certs/ca.pem,
so TLS is verified end to end instead of skipped. Existing files are kept while they are
valid (signed by the CA, every SAN present, not about to expire); --force replaces them.
--no-ca-key keeps no CA key once the server certificate is signed (compose's shared volume):
a set without it is still valid, and is replaced by a new CA when it no longer is.
"""

import argparse
import datetime
import ipaddress
import os
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from labrunner.paths import REPO
from services.common.stacks import STACKS

DEFAULT_DIR = REPO / "certs"
CA_FILE, CA_KEY_FILE = "ca.pem", "ca-key.pem"
SERVER_FILE, SERVER_KEY_FILE = "server.pem", "server-key.pem"
# Every name a client may dial: local processes and each stack's docker compose service.
DNS_NAMES = ("localhost", *(stack.compose_name for stack in STACKS))
IP_ADDRESSES = ("127.0.0.1", "::1", "198.18.0.1")  # the last: the service on a network scenario's link
CA_LIFETIME = datetime.timedelta(days=3650)
SERVER_LIFETIME = datetime.timedelta(days=825)
RENEW_BEFORE = datetime.timedelta(days=30)
KEY_MODE = 0o600
CERT_MODE = 0o644


def san(name: str) -> x509.GeneralName:
    """An IP address SAN for an address, a DNS SAN for anything else."""
    try:
        return x509.IPAddress(ipaddress.ip_address(name))
    except ValueError:
        return x509.DNSName(name)


def required_sans(extra: Sequence[str] = ()) -> set[x509.GeneralName]:
    """The lab's names, plus extra ones (a publish address other hosts dial: --san)."""
    return {san(name) for name in (*DNS_NAMES, *IP_ADDRESSES, *extra)}


def server_names(directory: Path) -> set[str]:
    """The names and addresses the server certificate in directory holds."""
    server = x509.load_pem_x509_certificate((directory / SERVER_FILE).read_bytes())
    names = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return {str(name.value) for name in names}


def problem(directory: Path, extra: Sequence[str] = ()) -> str | None:
    """Why the certificates in directory cannot be used as they are; None when they can."""
    try:
        ca = x509.load_pem_x509_certificate((directory / CA_FILE).read_bytes())
        server = x509.load_pem_x509_certificate((directory / SERVER_FILE).read_bytes())
        # Optional: a set whose CA key was dropped after signing (--no-ca-key) still verifies.
        ca_key_file = directory / CA_KEY_FILE
        ca_key = (
            serialization.load_pem_private_key(ca_key_file.read_bytes(), None)
            if ca_key_file.exists()
            else None
        )
        server_key = serialization.load_pem_private_key((directory / SERVER_KEY_FILE).read_bytes(), None)
    except FileNotFoundError as exc:
        return f"{Path(exc.filename).name} is missing"
    except ValueError as exc:
        return f"unreadable certificate or key: {exc}"
    try:
        server.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        return f"{SERVER_FILE} is not signed by {CA_FILE}"
    if (ca_key is not None and ca_key.public_key() != ca.public_key()) or (
        server_key.public_key() != server.public_key()
    ):
        return "a key does not match its certificate"
    sans = set(server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value)
    if missing := required_sans(extra) - sans:
        return f"{SERVER_FILE} lacks SANs {sorted(str(n.value) for n in missing)}"
    expires = min(ca.not_valid_after_utc, server.not_valid_after_utc)
    if expires - datetime.datetime.now(datetime.UTC) < RENEW_BEFORE:
        return f"a certificate expires on {expires:%Y-%m-%d}"
    return None


def ensure_certs(
    directory: Path = DEFAULT_DIR, force: bool = False, extra: Sequence[str] = (), keep_ca_key: bool = True
) -> bool:
    """Generate the CA and server certificate unless valid ones exist; True when generated.
    keep_ca_key=False: no CA key is left in directory (an existing one is removed)."""
    if not force and problem(directory, extra) is None:
        if not keep_ca_key:
            (directory / CA_KEY_FILE).unlink(missing_ok=True)
        for name in (CA_KEY_FILE, SERVER_KEY_FILE):
            if (directory / name).exists():
                (directory / name).chmod(KEY_MODE)
        return False
    generate(directory, extra, keep_ca_key)
    return True


def generate(directory: Path, extra: Sequence[str] = (), keep_ca_key: bool = True) -> None:
    """A fresh CA (EC P-256) and a server certificate it signs, with every lab SAN and extra ones;
    the CA's key is written only with keep_ca_key (else it exists in memory only, while signing)."""
    directory.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "protolab lab CA")])
    ca = (
        _builder(ca_name, ca_name, ca_key.public_key(), now, CA_LIFETIME)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(cert_sign=True), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    server_key = ec.generate_private_key(ec.SECP256R1())
    server_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    server = (
        _builder(server_name, ca_name, server_key.public_key(), now, SERVER_LIFETIME)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(cert_sign=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectAlternativeName(sorted(required_sans(extra), key=str)), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    if keep_ca_key:
        write_file(directory / CA_KEY_FILE, _pem_key(ca_key), KEY_MODE)
    else:
        (directory / CA_KEY_FILE).unlink(missing_ok=True)
    write_file(directory / SERVER_KEY_FILE, _pem_key(server_key), KEY_MODE)
    write_file(directory / CA_FILE, ca.public_bytes(serialization.Encoding.PEM), CERT_MODE)
    write_file(directory / SERVER_FILE, server.public_bytes(serialization.Encoding.PEM), CERT_MODE)


def _builder(
    subject: x509.Name,
    issuer: x509.Name,
    public_key: ec.EllipticCurvePublicKey,
    now: datetime.datetime,
    lifetime: datetime.timedelta,
) -> x509.CertificateBuilder:
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))  # tolerate small clock skew
        .not_valid_after(now + lifetime)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public_key), critical=False)
    )


def _key_usage(cert_sign: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=cert_sign,
        crl_sign=cert_sign,
        encipher_only=False,
        decipher_only=False,
    )


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def write_file(path: Path, data: bytes, mode: int) -> None:
    """Write atomically with the given mode; mkstemp creates the file 0600, so a key is never
    readable by others, not even briefly."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--dir", type=Path, default=DEFAULT_DIR, help=f"output directory (default: {DEFAULT_DIR})"
    )
    parser.add_argument("--force", action="store_true", help="regenerate even if valid certificates exist")
    parser.add_argument(
        "--san",
        action="append",
        default=[],
        metavar="NAME",
        help="another name or address the server certificate must hold, e.g. the address the "
        "services are published on for k6 on other hosts (repeatable)",
    )
    parser.add_argument(
        "--no-ca-key",
        action="store_true",
        help="keep no CA key in the directory once the server certificate is signed (a directory "
        "other containers mount); an existing one is removed",
    )
    args = parser.parse_args(argv)
    extra = [name for name in args.san if name]  # compose passes "" when PUBLISH_ADDRESS is unset
    reason = "--force" if args.force else problem(args.dir, extra)
    if ensure_certs(args.dir, force=args.force, extra=extra, keep_ca_key=not args.no_ca_key):
        print(f"generated CA and server certificate in {args.dir} ({reason})")
    else:
        print(f"kept the valid certificates in {args.dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
