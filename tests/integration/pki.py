"""A throwaway public-key infrastructure for tests: a swarm CA and member certificates, made
with the openssl command line (every member certificate names the swarm, `gwtf-swarm`)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from gwtf.node.rpc.security import TLS_TARGET_NAME


def openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def make_ca(folder: Path, name: str) -> tuple[Path, Path]:
    """(key, certificate) of a new CA."""
    key, cert = folder / f"{name}-ca.key", folder / f"{name}-ca.pem"
    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
            "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "2",
            "-subj", f"/CN={name} swarm CA")  # fmt: skip
    return key, cert


def make_member(folder: Path, name: str, ca: tuple[Path, Path]) -> tuple[Path, Path, Path]:
    """(certificate, key, CA certificate) of a member signed by `ca`."""
    key, csr, cert = folder / f"{name}.key", folder / f"{name}.csr", folder / f"{name}.pem"
    ext = folder / f"{name}.ext"
    ext.write_text(f"subjectAltName=DNS:{TLS_TARGET_NAME}\n")
    openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-keyout", str(key), "-out", str(csr), "-subj", f"/CN={TLS_TARGET_NAME}")  # fmt: skip
    openssl("x509", "-req", "-in", str(csr), "-CA", str(ca[1]), "-CAkey", str(ca[0]),
            "-CAcreateserial", "-out", str(cert), "-days", "2", "-extfile", str(ext))  # fmt: skip
    return cert, key, ca[1]
