"""Certificates for a local control plane: one CA, the apiserver's serving cert, client certs for
the admin and for kube-controller-manager, and the service-account signing key pair.

EC P-256 keys: generating them takes microseconds (RSA takes tens of milliseconds each), and
kube-apiserver accepts ECDSA for serving, client certificates and service-account tokens.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

#: Names the apiserver answers to: loopback for us, the in-cluster service names for pods.
SERVING_DNS_NAMES = (
    "localhost",
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
)
SERVING_IPS = ("127.0.0.1", "10.96.0.1")
VALIDITY = dt.timedelta(days=365)


@dataclass(frozen=True)
class Pki:
    """Paths of the PEM files written by `create_pki`."""

    ca_cert: Path
    ca_key: Path
    serving_cert: Path
    serving_key: Path
    admin_cert: Path
    admin_key: Path
    sa_key: Path
    sa_pub: Path
    controller_manager_cert: Path
    controller_manager_key: Path


#: File names of `Pki`'s fields, in order.
PKI_FILES = ("ca.crt", "ca.key", "apiserver.crt", "apiserver.key", "admin.crt", "admin.key",
             "sa.key", "sa.pub", "controller-manager.crt", "controller-manager.key")

#: The user kube-controller-manager authenticates as: the default RBAC policy binds it to
#: system:kube-controller-manager (and, with --use-service-account-credentials, each controller
#: then acts as its own ServiceAccount in kube-system).
CONTROLLER_MANAGER_USER = "system:kube-controller-manager"


def pki_paths(directory: Path) -> Pki:
    """Where `create_pki(directory)` writes each file."""
    return Pki(*(directory / name for name in PKI_FILES))


def _name(common_name: str, organization: str | None = None) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    if organization:
        attrs.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization))
    return x509.Name(attrs)


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                       serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    path.chmod(0o600)


def _write_cert(path: Path, cert: x509.Certificate) -> None:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def _issue(subject: x509.Name, key: ec.EllipticCurvePrivateKey, issuer: x509.Name,
           issuer_key: ec.EllipticCurvePrivateKey, *, ca: bool,
           usages: list[x509.ObjectIdentifier], san: x509.SubjectAlternativeName | None
           ) -> x509.Certificate:
    # Backdate a little so a cert is valid on a machine whose clock is slightly behind.
    now = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + VALIDITY)
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(digital_signature=True, key_encipherment=not ca, content_commitment=False,
                          data_encipherment=False, key_agreement=False, key_cert_sign=ca,
                          crl_sign=ca, encipher_only=False, decipher_only=False),
            critical=True,
        )
    )
    if usages:
        builder = builder.add_extension(x509.ExtendedKeyUsage(usages), critical=False)
    if san is not None:
        builder = builder.add_extension(san, critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def create_pki(directory: Path) -> Pki:
    """Write a fresh CA, serving cert, client certs and SA key pair into `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    pki = pki_paths(directory)

    ca_key = _key()
    ca_name = _name("elastic-gpu-devcluster-ca")
    ca_cert = _issue(ca_name, ca_key, ca_name, ca_key, ca=True, usages=[], san=None)

    serving_key = _key()
    san = x509.SubjectAlternativeName(
        [x509.DNSName(n) for n in SERVING_DNS_NAMES]
        + [x509.IPAddress(ipaddress.ip_address(ip)) for ip in SERVING_IPS])
    serving_cert = _issue(_name("kube-apiserver"), serving_key, ca_name, ca_key, ca=False,
                          usages=[ExtendedKeyUsageOID.SERVER_AUTH], san=san)

    # O=system:masters: the group RBAC binds to cluster-admin, so the admin needs no bindings.
    admin_key = _key()
    admin_cert = _issue(_name("elastic-gpu-admin", "system:masters"), admin_key, ca_name, ca_key,
                        ca=False, usages=[ExtendedKeyUsageOID.CLIENT_AUTH], san=None)

    kcm_key = _key()
    kcm_cert = _issue(_name(CONTROLLER_MANAGER_USER), kcm_key, ca_name, ca_key, ca=False,
                      usages=[ExtendedKeyUsageOID.CLIENT_AUTH], san=None)

    sa_key = _key()
    _write_cert(pki.controller_manager_cert, kcm_cert)
    _write_key(pki.controller_manager_key, kcm_key)
    _write_cert(pki.ca_cert, ca_cert)
    _write_key(pki.ca_key, ca_key)
    _write_cert(pki.serving_cert, serving_cert)
    _write_key(pki.serving_key, serving_key)
    _write_cert(pki.admin_cert, admin_cert)
    _write_key(pki.admin_key, admin_key)
    _write_key(pki.sa_key, sa_key)
    pki.sa_pub.write_bytes(sa_key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    return pki
