"""TLS with a client certificate and a bearer token, against a server with
an auth file: each principal gets what its rules give, and a refusal
carries the server's rule."""

from __future__ import annotations

import hashlib
import os
import subprocess

import pytest

import baton
from baton import errors

from .conftest import Server


def openssl(*args: str, cwd: str) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def make_pki(d: str) -> None:
    """A CA, a server certificate for 127.0.0.1, and client certificates
    for `ops` (a principal proven by its certificate) and `stranger`."""
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "1",
            "-subj", "/CN=baton test CA", cwd=d)  # fmt: skip
    exts = {
        "server": "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n",
        "ops": "extendedKeyUsage=clientAuth\n",
        "stranger": "extendedKeyUsage=clientAuth\n",
    }
    for name, ext in exts.items():
        # An extension file makes an X.509 v3 certificate (rustls refuses v1).
        with open(os.path.join(d, f"{name}.ext"), "w") as f:
            f.write(ext)
        openssl("req", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr",
                "-subj", f"/CN={name}", cwd=d)  # fmt: skip
        openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
                "-CAcreateserial", "-out", f"{name}.pem", "-days", "1",
                "-extfile", f"{name}.ext", cwd=d)  # fmt: skip


def test_tls_with_a_client_certificate_and_a_token(tmp_dir: str) -> None:
    make_pki(tmp_dir)
    token = "py-billing-token-0123456789"
    digest = hashlib.sha256(token.encode()).hexdigest()
    auth = os.path.join(tmp_dir, "auth.toml")
    with open(auth, "w") as f:
        f.write(
            f'[[principal]]\nname = "billing"\ntoken_sha256 = "{digest}"\n'
            'rules = { "py:" = ["read", "lease"] }\n\n'
            '[[principal]]\nname = "ops"\nrules = { "" = ["read", "fence", "admin"] }\n'
        )
    os.chmod(auth, 0o600)
    token_file = os.path.join(tmp_dir, "token")
    with open(token_file, "w") as f:
        f.write(token + "\n")
    os.chmod(token_file, 0o600)

    def pem(name: str) -> str:
        return os.path.join(tmp_dir, name)

    server = Server(
        os.path.join(tmp_dir, "data"),
        [
            "--tls-cert",
            pem("server.pem"),
            "--tls-key",
            pem("server.key"),
            "--tls-client-ca",
            pem("ca.pem"),
            "--auth-file",
            auth,
        ],
    )
    try:
        billing = baton.Client(
            server.address,
            ca_file=pem("ca.pem"),
            cert_file=pem("stranger.pem"),
            key_file=pem("stranger.key"),
            token_file=token_file,
        )
        lease = billing.acquire("py:tls", ttl_s=5)
        assert billing.status("py:tls").holder_token == lease.token
        with pytest.raises(errors.PermissionDenied, match="billing"):
            billing.fence("py:tls")

        ops = baton.Client(
            server.address,
            ca_file=pem("ca.pem"),
            cert_file=pem("ops.pem"),
            key_file=pem("ops.key"),
        )
        assert ops.status("py:tls").holder_token == lease.token
        with pytest.raises(errors.PermissionDenied, match="`lease`") as denied:
            ops.acquire("py:other", ttl_s=5)
        assert denied.value.definite
        assert ops.fence("py:tls").revoked_token == lease.token

        nobody = baton.Client(
            server.address,
            ca_file=pem("ca.pem"),
            cert_file=pem("stranger.pem"),
            key_file=pem("stranger.key"),
        )
        with pytest.raises(errors.Unauthenticated):
            nobody.status("py:tls")
        # Plain text to a TLS port never reaches the service.
        plain = baton.Client(server.address, timeout_s=2)
        with pytest.raises(errors.BatonError):
            plain.status("py:tls")
    finally:
        server.stop()
