# -*- test-case-name: tests.process.test_tls -*-
"""
A throw-away certificate authority for tests: a CA and certificates it
signs, written as PEM files, made with the C{cryptography} package (a
dependency of pyOpenSSL, so present wherever TLS works).

    ca = TestCA(tmp_path)
    node = ca.issue("node", hosts=["127.0.0.1", "localhost"])
    client = ca.issue("client")
    # node.cert, node.key, ca.cert are file paths
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from typing import Any, List, Optional, Sequence

DEFAULT_HOSTS = ("127.0.0.1", "localhost", "::1")


class Issued:
    """
    PEM files of one certificate: C{cert} and C{key}.
    """

    def __init__(self, cert: str, key: str) -> None:
        self.cert = cert
        self.key = key


def _newKey() -> Any:
    from cryptography.hazmat.primitives.asymmetric import ec

    return ec.generate_private_key(ec.SECP256R1())


def _keyPEM(key: Any) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return key.private_bytes(  # type: ignore[no-any-return]
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption())


def _name(common: str) -> Any:
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


class TestCA:
    """
    A CA whose certificate and key live in C{directory}.
    """

    __test__ = False  # not a pytest test class

    def __init__(self, directory: Any, name: str = "lockservice test CA") -> None:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization

        self.directory = str(directory)
        self.key = _newKey()
        now = datetime.datetime.now(datetime.timezone.utc)
        self.certificate = (
            x509.CertificateBuilder()
            .subject_name(_name(name))
            .issuer_name(_name(name))
            .public_key(self.key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=30))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(
                digital_signature=True, key_cert_sign=True, crl_sign=True,
                content_commitment=False, key_encipherment=False, data_encipherment=False,
                key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
            .sign(self.key, hashes.SHA256())
        )
        self.cert = self._write(f"{_slug(name)}.pem",
                                self.certificate.public_bytes(serialization.Encoding.PEM))

    def _write(self, filename: str, data: bytes) -> str:
        path = os.path.join(self.directory, filename)
        with open(path, "wb") as f:
            f.write(data)
        return path

    def issue(self, name: str, hosts: Optional[Sequence[str]] = DEFAULT_HOSTS,
              days: int = 30) -> Issued:
        """
        A certificate for C{name}, valid for server use on C{hosts} (IP
        addresses or DNS names) and for client use.

        @param days: validity from now; negative for an expired one.
        """
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.x509.oid import ExtendedKeyUsageOID

        key = _newKey()
        now = datetime.datetime.now(datetime.timezone.utc)
        start, end = now - datetime.timedelta(days=1), now + datetime.timedelta(days=days)
        if days < 0:
            start = end - datetime.timedelta(days=1)
        builder = (
            x509.CertificateBuilder()
            .subject_name(_name(name))
            .issuer_name(self.certificate.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(start)
            .not_valid_after(end)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                critical=False)
        )
        names: List[Any] = []
        for host in hosts or ():
            try:
                names.append(x509.IPAddress(ipaddress.ip_address(host)))
            except ValueError:
                names.append(x509.DNSName(host))
        if names:
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        certificate = builder.sign(self.key, hashes.SHA256())
        slug = _slug(name)
        return Issued(
            self._write(f"{slug}.pem", certificate.public_bytes(serialization.Encoding.PEM)),
            self._write(f"{slug}.key", _keyPEM(key)),
        )


def _slug(name: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in name)
