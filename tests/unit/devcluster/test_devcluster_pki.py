import ssl

from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from elastic_gpu.devcluster.kubeconfig import write_kubeconfig
from elastic_gpu.devcluster.pki import create_pki


def _load(path):
    return x509.load_pem_x509_certificate(path.read_bytes())


def test_serving_cert_is_signed_by_ca_and_names_loopback(tmp_path):
    pki = create_pki(tmp_path)
    ca, serving = _load(pki.ca_cert), _load(pki.serving_cert)
    serving.verify_directly_issued_by(ca)
    san = serving.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "127.0.0.1" in {str(ip) for ip in san.get_values_for_type(x509.IPAddress)}
    assert "kubernetes.default.svc" in san.get_values_for_type(x509.DNSName)
    usage = serving.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert ExtendedKeyUsageOID.SERVER_AUTH in usage


def test_admin_cert_is_a_system_masters_client(tmp_path):
    pki = create_pki(tmp_path)
    admin = _load(pki.admin_cert)
    admin.verify_directly_issued_by(_load(pki.ca_cert))
    orgs = admin.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)
    assert [o.value for o in orgs] == ["system:masters"]
    usage = admin.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert ExtendedKeyUsageOID.CLIENT_AUTH in usage
    # Python's TLS stack accepts the pair as a client identity.
    ctx = ssl.create_default_context(cafile=str(pki.ca_cert))
    ctx.load_cert_chain(str(pki.admin_cert), str(pki.admin_key))


def test_service_account_keys_are_a_pair(tmp_path):
    from cryptography.hazmat.primitives import hashes, serialization

    pki = create_pki(tmp_path)
    key = serialization.load_pem_private_key(pki.sa_key.read_bytes(), None)
    pub = serialization.load_pem_public_key(pki.sa_pub.read_bytes())
    signature = key.sign(b"token", ec.ECDSA(hashes.SHA256()))
    pub.verify(signature, b"token", ec.ECDSA(hashes.SHA256()))
    assert pki.sa_key.stat().st_mode & 0o077 == 0


def test_kubeconfig_inlines_credentials(tmp_path):
    import base64

    import yaml

    pki = create_pki(tmp_path / "pki")
    path = write_kubeconfig(tmp_path / "kc", "https://127.0.0.1:6443", pki)
    conf = yaml.safe_load(path.read_text())
    assert conf["clusters"][0]["cluster"]["server"] == "https://127.0.0.1:6443"
    user = conf["users"][0]["user"]
    assert base64.b64decode(user["client-certificate-data"]) == pki.admin_cert.read_bytes()
    assert conf["current-context"] == conf["contexts"][0]["name"]


def test_controller_manager_cert_is_the_user_default_rbac_binds(tmp_path):
    """kube-controller-manager needs no bindings of ours: the default RBAC policy binds the
    user system:kube-controller-manager (no group: not an admin)."""
    pki = create_pki(tmp_path)
    cert = _load(pki.controller_manager_cert)
    cert.verify_directly_issued_by(_load(pki.ca_cert))
    assert [a.value for a in cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)] == [
        "system:kube-controller-manager"]
    assert cert.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME) == []
    usage = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert ExtendedKeyUsageOID.CLIENT_AUTH in usage
    ctx = ssl.create_default_context(cafile=str(pki.ca_cert))
    ctx.load_cert_chain(str(pki.controller_manager_cert), str(pki.controller_manager_key))


def test_kubeconfig_for_another_identity_inlines_its_cert(tmp_path):
    import base64

    import yaml

    pki = create_pki(tmp_path / "pki")
    path = write_kubeconfig(tmp_path / "kcm.kubeconfig", "https://127.0.0.1:6443", pki,
                            client=(pki.controller_manager_cert, pki.controller_manager_key))
    user = yaml.safe_load(path.read_text())["users"][0]["user"]
    assert base64.b64decode(user["client-certificate-data"]) == \
        pki.controller_manager_cert.read_bytes()
    assert base64.b64decode(user["client-key-data"]) == pki.controller_manager_key.read_bytes()
