"""The dev control plane's own PKI: one CA, a serving certificate and client certificates.

kube-apiserver authenticates clients by X.509 certificates signed by ``--client-ca-file``:
the certificate's CN is the user name and each O is a group. That is all the test
harness needs to mint any identity (``system:masters`` for the admin, plain users
without any RBAC for least-privilege tests), with no token files and no
controller-manager.
"""

from __future__ import annotations

import dataclasses
import datetime
import ipaddress
import pathlib
from collections.abc import Sequence

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_VALIDITY = datetime.timedelta(days=2)


@dataclasses.dataclass(frozen=True, kw_only=True)
class KeyPair:
    cert_pem: bytes
    key_pem: bytes

    def write(self, *, directory: pathlib.Path, stem: str) -> tuple[pathlib.Path, pathlib.Path]:
        cert, key = directory / f"{stem}.crt", directory / f"{stem}.key"
        cert.write_bytes(self.cert_pem)
        key.write_bytes(self.key_pem)
        key.chmod(0o600)
        return cert, key


def _new_key() -> ec.EllipticCurvePrivateKey:
    # P-256 keys are generated in microseconds; RSA-2048 would cost ~50 ms per identity.
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


@dataclasses.dataclass(frozen=True)
class CertificateAuthority:
    cert: x509.Certificate
    key: ec.EllipticCurvePrivateKey

    @classmethod
    def create(cls, *, common_name: str = "bindery-dev-ca") -> CertificateAuthority:
        key = _new_key()
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
        now = datetime.datetime.now(datetime.UTC)
        cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + _VALIDITY)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    key_cert_sign=True,
                    crl_sign=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .sign(key, hashes.SHA256())
        )
        return cls(cert, key)

    @property
    def cert_pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)

    def _issue(
        self,
        *,
        subject: x509.Name,
        usage: x509.ObjectIdentifier,
        sans: Sequence[x509.GeneralName] = (),
    ) -> KeyPair:
        key = _new_key()
        now = datetime.datetime.now(datetime.UTC)
        builder = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + _VALIDITY)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        )
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(list(sans)), critical=False)
        cert = builder.sign(self.key, hashes.SHA256())
        return KeyPair(cert_pem=cert.public_bytes(serialization.Encoding.PEM), key_pem=_key_pem(key))

    def issue_server(self, *, hosts: Sequence[str], ips: Sequence[str]) -> KeyPair:
        sans: list[x509.GeneralName] = [x509.DNSName(h) for h in hosts]
        sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0] if hosts else ips[0])])
        return self._issue(subject=subject, usage=ExtendedKeyUsageOID.SERVER_AUTH, sans=sans)

    def issue_client(self, *, user: str, groups: Sequence[str] = ()) -> KeyPair:
        attrs = [x509.NameAttribute(NameOID.COMMON_NAME, user)]
        attrs += [x509.NameAttribute(NameOID.ORGANIZATION_NAME, g) for g in groups]
        return self._issue(subject=x509.Name(attrs), usage=ExtendedKeyUsageOID.CLIENT_AUTH)


def service_account_keys() -> KeyPair:
    """The key pair kube-apiserver signs and verifies service-account tokens with.

    ``cert_pem`` holds the public key (PEM), not a certificate: that is what
    ``--service-account-key-file`` accepts.
    """
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    public = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return KeyPair(cert_pem=public, key_pem=_key_pem(key))
