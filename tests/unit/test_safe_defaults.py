"""Safe defaults that tests/integration/test_compose_*.py do not already hold: no private key in the
repository, and no client that skips TLS verification.

tests/integration/test_compose_safety.py covers the rest of the list:
test_every_published_port_is_bound_to_loopback, test_grafana_has_no_default_admin_password,
test_no_container_gets_the_docker_socket_or_privileges, test_service_images_do_not_run_as_root and
test_generated_and_private_files_stay_out_of_the_build_context;
tests/unit/test_certs.py shows the lab CA verifies the server and a foreign CA does not.
"""

import re
import subprocess
from pathlib import Path

import pytest

from tests.support import ROOT

# PEM private keys of every kind: "PRIVATE KEY", "RSA PRIVATE KEY", "EC PRIVATE KEY", "OPENSSH ...".
PRIVATE_KEY = re.compile(rb"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY-----")
# What clients and configs the lab ships may never contain: each turns TLS verification off.
SKIPS_VERIFICATION = {
    "k6 insecureSkipTLSVerify": re.compile(r"insecureSkipTLSVerify"),
    "Go InsecureSkipVerify": re.compile(r"InsecureSkipVerify"),
    "requests/httpx verify=False": re.compile(r"\bverify\s*=\s*False\b"),
    "ssl.CERT_NONE": re.compile(r"\bCERT_NONE\b"),
    "check_hostname = False": re.compile(r"\bcheck_hostname\s*=\s*False\b"),
    "ssl._create_unverified_context": re.compile(r"_create_unverified_context"),
    "PYTHONHTTPSVERIFY=0": re.compile(r"PYTHONHTTPSVERIFY"),
    "Grafana tlsSkipVerify": re.compile(r"tlsSkipVerify\W+true", re.I),
    "Prometheus insecure_skip_verify": re.compile(r"insecure_skip_verify\W+true", re.I),
    "curl/wget --insecure": re.compile(
        r"\b(?:curl|wget)\b.*(?<![\w-])(?:-k|--insecure|--no-check-certificate)(?![\w-])"
    ),
}
# Everything the lab runs or configures; tests/ is left out (a test may build a bad client on purpose).
SHIPPED = [
    "k6",
    "scripts",
    "services",
    "grafana",
    "prometheus",
    "influxdb",
    "docker-compose.yml",
    ".env.example",
]


def git_files(*pathspecs: str) -> list[Path]:
    """Tracked files plus untracked ones not ignored: what `git add -A` would commit."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", "--", *pathspecs],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout
    return [
        ROOT / name for name in sorted(set(listed.decode().split("\0"))) if name and (ROOT / name).is_file()
    ]


def test_the_repository_can_be_listed() -> None:
    files = git_files()
    assert ROOT / "docker-compose.yml" in files and ROOT / "services" / "Dockerfile" in files


def test_no_private_key_is_committed() -> None:
    keys = [str(path.relative_to(ROOT)) for path in git_files() if PRIVATE_KEY.search(path.read_bytes())]
    assert not keys, f"private keys in the repository: {keys}"


@pytest.mark.parametrize(
    "path", ["certs/server-key.pem", "certs/ca-key.pem", ".env", "results/run/manifest.json"]
)
def test_generated_secrets_and_results_are_ignored_by_git(path: str) -> None:
    ignored = subprocess.run(["git", "check-ignore", "-q", "--no-index", path], cwd=ROOT, check=False)
    assert ignored.returncode == 0, f"{path} is not in .gitignore"


@pytest.mark.parametrize("path", ["scripts/labrunner/results/__init__.py", "scripts/labrunner/certs.py"])
def test_source_named_like_an_output_folder_is_not_ignored(path: str) -> None:
    # /results/ and /certs/ are the repository root's: the package's results/ is source.
    ignored = subprocess.run(["git", "check-ignore", "-q", "--no-index", path], cwd=ROOT, check=False)
    assert ignored.returncode == 1, f"{path} is ignored by .gitignore"


def test_the_private_key_pattern_finds_keys() -> None:
    # The scan above proves nothing if the pattern misses the keys scripts/gen_certs.py writes.
    for label in (b"PRIVATE KEY", b"RSA PRIVATE KEY", b"EC PRIVATE KEY", b"OPENSSH PRIVATE KEY"):
        assert PRIVATE_KEY.search(b"x\n-----BEGIN " + label + b"-----\nMIIE")
    assert not PRIVATE_KEY.search(b"-----BEGIN CERTIFICATE-----")


def test_no_shipped_client_or_config_skips_tls_verification() -> None:
    shipped = git_files(*SHIPPED)
    # The scan reads the clients and configs: an empty or misspelt list would find nothing.
    assert {
        ROOT / "k6" / "rest.js",
        ROOT / "docker-compose.yml",
        ROOT / "services" / "common" / "tls.py",
    } <= set(shipped), shipped[:5]
    found = []
    for path in shipped:
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue  # binary (a dashboard screenshot); no client setting lives there
        for number, line in enumerate(text.splitlines(), start=1):
            found += [
                f"{path.relative_to(ROOT)}:{number}: {what}: {line.strip()}"
                for what, pattern in SKIPS_VERIFICATION.items()
                if pattern.search(line)
            ]
    assert not found, "\n".join(found)


@pytest.mark.parametrize(
    "line",
    [
        "const res = http.get(url, { insecureSkipTLSVerify: true });",
        "httpx.Client(verify=False)",
        "context.verify_mode = ssl.CERT_NONE",
        "context.check_hostname = False",
        "      tlsSkipVerify: true",
        "  insecure_skip_verify: true",
        'test: ["CMD", "curl", "-k", "https://127.0.0.1"]',
        "wget --no-check-certificate -q -O /dev/null https://127.0.0.1:3000",
    ],
)
def test_the_verification_patterns_catch_what_they_name(line: str) -> None:
    assert any(pattern.search(line) for pattern in SKIPS_VERIFICATION.values()), line
