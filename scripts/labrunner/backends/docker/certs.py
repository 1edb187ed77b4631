"""The services' TLS material on the docker backend: the certs volume's CA adopted into --certs,
and the check that its certificate names the publish address."""

from pathlib import Path

from docker.models.containers import Container

from labrunner import certs
from labrunner.backends.base import ScenarioFailed
from labrunner.backends.docker.archives import read_files
from labrunner.backends.docker.names import CERTS_DIR, CERTS_VOLUME

_CERT_MODES = {
    certs.CA_FILE: certs.CERT_MODE,
    certs.CA_KEY_FILE: certs.KEY_MODE,
    certs.SERVER_FILE: certs.CERT_MODE,
    certs.SERVER_KEY_FILE: certs.KEY_MODE,
}


def adopt_certs(container: Container, directory: Path, publish: str) -> list[str]:
    """Copy the certs volume's TLS material into directory (--certs), so the runner trusts the
    containers' CA; the notes to show (what was copied).

    The services present the certificate compose's one-shot `certs` service wrote into the
    volume; the runner verifies them from the host against <certs>/ca.pem, so that file must
    come from the same CA. The keys come along so the directory stays one valid set.
    """
    files = read_files(container, CERTS_DIR, _CERT_MODES)
    if certs.CA_FILE not in files:
        raise ScenarioFailed(
            "start", f"volume {CERTS_VOLUME} holds no {certs.CA_FILE}: run `docker compose up -d`"
        )
    changed = sorted(n for n, data in files.items() if _read_bytes(directory / n) != data)
    if certs.CA_KEY_FILE not in files:  # compose's one-shot keeps none: an older CA's would not match
        (directory / certs.CA_KEY_FILE).unlink(missing_ok=True)
    for file_name in changed:
        certs.write_file(directory / file_name, files[file_name], _CERT_MODES[file_name])
    # Every lab certificate names 127.0.0.1; another address, only when compose's `certs` had it.
    if publish not in certs.IP_ADDRESSES and publish not in certs.server_names(directory):
        raise ScenarioFailed(
            "start",
            f"the certificate in volume {CERTS_VOLUME} does not name the publish address "
            f"{publish}, which k6 dials: recreate it with "
            f"`PUBLISH_ADDRESS={publish} docker compose up -d`",
        )
    if not changed:
        return []
    return [f"copied {', '.join(changed)} from volume {CERTS_VOLUME} into {directory} (the services' CA)"]


def _read_bytes(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except OSError:
        return None
