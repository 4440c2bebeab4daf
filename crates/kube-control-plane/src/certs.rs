//! The control plane's certificates: one CA that signs kube-apiserver's serving
//! certificate and a client certificate per identity, the service-account signing key,
//! and a kubeconfig per identity with everything embedded.

use std::fs;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType,
};

use crate::{Error, Result};

/// Who a client certificate speaks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Identity {
    /// A cluster administrator: group `system:masters`, which RBAC never refuses.
    Admin,
    /// `system:kube-controller-manager`, bound by RBAC's bootstrap policy.
    ControllerManager,
    /// `system:kube-scheduler`, bound by RBAC's bootstrap policy.
    Scheduler,
}

impl Identity {
    /// Every identity a control plane gets a kubeconfig for.
    pub const ALL: [Identity; 3] = [
        Identity::Admin,
        Identity::ControllerManager,
        Identity::Scheduler,
    ];

    fn name(self) -> &'static str {
        match self {
            Identity::Admin => "admin",
            Identity::ControllerManager => "kube-controller-manager",
            Identity::Scheduler => "kube-scheduler",
        }
    }

    fn subject(self) -> (&'static str, Option<&'static str>) {
        match self {
            Identity::Admin => ("graceful-drain-admin", Some("system:masters")),
            Identity::ControllerManager => ("system:kube-controller-manager", None),
            Identity::Scheduler => ("system:kube-scheduler", None),
        }
    }

    /// The kubeconfig's file name in the control plane's folder.
    pub fn kubeconfig(self) -> String {
        format!("{}.kubeconfig", self.name())
    }
}

/// Paths of the files every component reads.
#[derive(Clone, Debug)]
pub struct Pki {
    /// The CA certificate (PEM) that signed every certificate here; clients trust it and
    /// kube-apiserver verifies client certificates against it.
    pub ca_cert: PathBuf,
    /// kube-apiserver's serving certificate (PEM), valid for `localhost`, 127.0.0.1, ::1
    /// and the `kubernetes` Service's names.
    pub apiserver_cert: PathBuf,
    /// The serving certificate's private key (PEM, mode 0600).
    pub apiserver_key: PathBuf,
    /// The service-account signing key (PEM, mode 0600), which kube-apiserver signs
    /// tokens with and kube-controller-manager is given as well.
    pub sa_key: PathBuf,
    /// The public half of `sa_key` (PEM), which kube-apiserver verifies tokens with.
    pub sa_pub: PathBuf,
    ca_pem: String,
    clients: Vec<(Identity, String, String)>,
}

/// Generates the CA, the serving and client certificates and the service-account key in
/// `dir/pki` (keys mode 0600).
pub fn generate(dir: &Path) -> Result<Pki> {
    let pki = dir.join("pki");
    fs::create_dir_all(&pki).map_err(|e| Error::io(&pki, e))?;
    let ca_key = KeyPair::generate()?;
    let mut ca = CertificateParams::default();
    ca.distinguished_name = dn("graceful-drain control-plane CA", None);
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca_cert = ca.self_signed(&ca_key)?;
    let issuer = Issuer::new(ca, &ca_key);

    let names = [
        "localhost",
        "kubernetes",
        "kubernetes.default",
        "kubernetes.default.svc",
        "kubernetes.default.svc.cluster.local",
    ];
    let mut serving =
        CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())?;
    serving.subject_alt_names.extend([
        SanType::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST)),
        SanType::IpAddress(IpAddr::V6(Ipv6Addr::LOCALHOST)),
        // The `kubernetes` Service's ClusterIP: named so in-cluster clients would verify it;
        // nothing here dials it.
        SanType::IpAddress(IpAddr::V4(Ipv4Addr::new(10, 96, 0, 1))),
    ]);
    serving.distinguished_name = dn("kube-apiserver", None);
    serving.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let serving_key = KeyPair::generate()?;
    let serving_cert = serving.signed_by(&serving_key, &issuer)?;

    let mut clients = Vec::new();
    for id in Identity::ALL {
        let (cn, org) = id.subject();
        let mut params = CertificateParams::default();
        params.distinguished_name = dn(cn, org);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &issuer)?;
        clients.push((id, cert.pem(), key.serialize_pem()));
    }
    let sa = KeyPair::generate()?;

    let out = Pki {
        ca_cert: pki.join("ca.crt"),
        apiserver_cert: pki.join("apiserver.crt"),
        apiserver_key: pki.join("apiserver.key"),
        sa_key: pki.join("sa.key"),
        sa_pub: pki.join("sa.pub"),
        ca_pem: ca_cert.pem(),
        clients,
    };
    write(&out.ca_cert, &out.ca_pem, false)?;
    write(&pki.join("ca.key"), &ca_key.serialize_pem(), true)?;
    write(&out.apiserver_cert, &serving_cert.pem(), false)?;
    write(&out.apiserver_key, &serving_key.serialize_pem(), true)?;
    write(&out.sa_key, &sa.serialize_pem(), true)?;
    write(&out.sa_pub, &sa.public_key_pem(), false)?;
    Ok(out)
}

/// Writes `dir/<identity>.kubeconfig` for `server`, certificates embedded.
pub fn write_kubeconfig(dir: &Path, pki: &Pki, id: Identity, server: &str) -> Result<PathBuf> {
    let (_, cert, key) = pki
        .clients
        .iter()
        .find(|(i, _, _)| *i == id)
        .ok_or_else(|| Error::Certificate(format!("no client certificate for {}", id.name())))?;
    let b64 = |s: &str| STANDARD.encode(s.as_bytes());
    let user = id.name();
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: control-plane\n  cluster:\n    server: {server}\n    certificate-authority-data: {ca}\nusers:\n- name: {user}\n  user:\n    client-certificate-data: {cert}\n    client-key-data: {key}\ncontexts:\n- name: {user}\n  context:\n    cluster: control-plane\n    user: {user}\ncurrent-context: {user}\n",
        ca = b64(&pki.ca_pem),
        cert = b64(cert),
        key = b64(key),
    );
    let path = dir.join(id.kubeconfig());
    write(&path, &text, true)?;
    Ok(path)
}

/// File name of the CA that signs kube-apiserver's client certificate for admission
/// webhooks (in `dir/pki`), which a webhook trusts with `--client-ca`.
pub const WEBHOOK_CLIENT_CA: &str = "webhook-client-ca.crt";

/// Makes kube-apiserver present a client certificate to every admission webhook: a CA of
/// its own (`dir/pki/`[`WEBHOOK_CLIENT_CA`], apart from the cluster CA, so a webhook that
/// trusts it trusts no other client), a certificate it signed, a kubeconfig whose user `*`
/// carries it (matched for any webhook host, `clientConfig` in
/// staging/src/k8s.io/apiserver/pkg/util/webhook/authentication.go) and the
/// AdmissionConfiguration naming that kubeconfig for both webhook plugins. Returns the
/// AdmissionConfiguration's path, for `--admission-control-config-file`.
pub fn write_webhook_client(dir: &Path) -> Result<PathBuf> {
    let pki = dir.join("pki");
    let ca_key = KeyPair::generate()?;
    let mut ca = CertificateParams::default();
    ca.distinguished_name = dn("graceful-drain webhook client CA", None);
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca_cert = ca.self_signed(&ca_key)?;
    let issuer = Issuer::new(ca, &ca_key);
    let mut client = CertificateParams::default();
    client.distinguished_name = dn("kube-apiserver-webhook-client", None);
    client.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    let key = KeyPair::generate()?;
    let cert = client.signed_by(&key, &issuer)?;
    write(&pki.join(WEBHOOK_CLIENT_CA), &ca_cert.pem(), false)?;
    let b64 = |s: &str| STANDARD.encode(s.as_bytes());
    let kubeconfig = pki.join("webhook-client.kubeconfig");
    let text = format!(
        "apiVersion: v1\nkind: Config\nusers:\n- name: \"*\"\n  user:\n    client-certificate-data: {cert}\n    client-key-data: {key}\n",
        cert = b64(&cert.pem()),
        key = b64(&key.serialize_pem()),
    );
    write(&kubeconfig, &text, true)?;
    let plugin = |name: &str| {
        format!(
            "- name: {name}\n  configuration:\n    apiVersion: apiserver.config.k8s.io/v1\n    kind: WebhookAdmissionConfiguration\n    kubeConfigFile: {}\n",
            kubeconfig.display()
        )
    };
    let config = pki.join("admission-config.yaml");
    let text = format!(
        "apiVersion: apiserver.config.k8s.io/v1\nkind: AdmissionConfiguration\nplugins:\n{}{}",
        plugin("ValidatingAdmissionWebhook"),
        plugin("MutatingAdmissionWebhook")
    );
    write(&config, &text, false)?;
    Ok(config)
}

fn dn(common_name: &str, organization: Option<&str>) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, common_name);
    if let Some(o) = organization {
        dn.push(DnType::OrganizationName, o);
    }
    dn
}

fn write(path: &Path, contents: &str, secret: bool) -> Result<()> {
    fs::write(path, contents).map_err(|e| Error::io(path, e))?;
    if secret {
        fs::set_permissions(path, fs::Permissions::from_mode(0o600))
            .map_err(|e| Error::io(path, e))?;
    }
    Ok(())
}
