//! `graceful-drain certs --out DIR`: a local certificate authority and a webhook serving
//! certificate signed by it, for local runs, the simulated cluster and tests.
//!
//! [`generate`] is the library entry point: it returns PEM strings; [`write()`] puts them
//! into a directory as `ca.crt`, `ca.key`, `tls.crt`, `tls.key` (the names a
//! `kubernetes.io/tls` Secret and cert-manager use), with private keys mode 0600.

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType,
};

/// Errors while generating or writing certificates.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// rcgen refused the parameters or failed to sign.
    #[error("generate certificate for {subject}")]
    Generate {
        /// Common name of the certificate or key being made (`… CA` for the authority).
        subject: String,
        /// What rcgen reported.
        #[source]
        source: rcgen::Error,
    },
    /// A file could not be written.
    #[error("write {path}")]
    Write {
        /// The file, or the directory that could not be created.
        path: PathBuf,
        /// The I/O error, including a failure to restrict a key's permissions.
        #[source]
        source: std::io::Error,
    },
}

/// Arguments of `graceful-drain certs`.
#[derive(Clone, Debug, clap::Args)]
pub struct Args {
    /// Directory to write ca.crt, ca.key, tls.crt and tls.key into (created if missing).
    #[arg(long, default_value = "certs/out")]
    pub out: PathBuf,
    /// DNS names of the serving certificate. Defaults to the in-cluster names of the
    /// webhook Service plus `localhost`.
    #[arg(long = "dns-name", value_name = "NAME")]
    pub dns_names: Vec<String>,
    /// IP addresses of the serving certificate.
    #[arg(long = "ip", value_name = "IP", default_values_t = [IpAddr::from([127, 0, 0, 1])])]
    pub ips: Vec<IpAddr>,
    /// Namespace of the webhook Service, for the default DNS names.
    #[arg(long, default_value = "graceful-drain")]
    pub namespace: String,
    /// Name of the webhook Service, for the default DNS names.
    #[arg(long, default_value = "graceful-drain-webhook")]
    pub service: String,
}

/// A CA and a serving certificate, PEM-encoded.
#[derive(Clone, Debug)]
pub struct Bundle {
    /// The CA certificate: what a webhook configuration's `caBundle` must hold.
    pub ca_cert: String,
    /// The CA's private key (PKCS#8); only needed to sign more certificates.
    pub ca_key: String,
    /// The serving certificate, signed by the CA, valid for server and client auth.
    pub cert: String,
    /// The serving certificate's private key (PKCS#8).
    pub key: String,
}

/// Paths of a written [`Bundle`].
#[derive(Clone, Debug)]
pub struct Paths {
    /// `DIR/ca.crt`.
    pub ca_cert: PathBuf,
    /// `DIR/ca.key`, mode 0600 on Unix.
    pub ca_key: PathBuf,
    /// `DIR/tls.crt`.
    pub cert: PathBuf,
    /// `DIR/tls.key`, mode 0600 on Unix.
    pub key: PathBuf,
}

/// The DNS names under which the API server reaches a webhook Service.
pub fn service_dns_names(service: &str, namespace: &str) -> Vec<String> {
    vec![
        service.to_string(),
        format!("{service}.{namespace}"),
        format!("{service}.{namespace}.svc"),
        format!("{service}.{namespace}.svc.cluster.local"),
    ]
}

/// Generates a fresh CA (`common_name` prefix) and a serving certificate for `dns_names`
/// and `ips`, signed by it.
pub fn generate(common_name: &str, dns_names: &[String], ips: &[IpAddr]) -> Result<Bundle, Error> {
    let ca_subject = format!("{common_name} CA");
    let gen_err = |subject: &str| {
        let subject = subject.to_string();
        move |source| Error::Generate { subject, source }
    };
    let ca_key = KeyPair::generate().map_err(gen_err(&ca_subject))?;
    let mut ca_params = CertificateParams::default();
    ca_params.distinguished_name = named(&ca_subject);
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let ca_cert = ca_params
        .self_signed(&ca_key)
        .map_err(gen_err(&ca_subject))?;

    let key = KeyPair::generate().map_err(gen_err(common_name))?;
    let mut params = CertificateParams::new(dns_names.to_vec()).map_err(gen_err(common_name))?;
    params
        .subject_alt_names
        .extend(ips.iter().map(|ip| SanType::IpAddress(*ip)));
    params.distinguished_name = named(common_name);
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    let issuer = Issuer::new(ca_params, &ca_key);
    let cert = params
        .signed_by(&key, &issuer)
        .map_err(gen_err(common_name))?;
    Ok(Bundle {
        ca_cert: ca_cert.pem(),
        ca_key: ca_key.serialize_pem(),
        cert: cert.pem(),
        key: key.serialize_pem(),
    })
}

fn named(common_name: &str) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, common_name);
    dn.push(DnType::OrganizationName, "graceful-drain");
    dn
}

/// Writes `bundle` into `dir` (created if missing); keys get mode 0600.
pub fn write(bundle: &Bundle, dir: &Path) -> Result<Paths, Error> {
    std::fs::create_dir_all(dir).map_err(|source| Error::Write {
        path: dir.to_path_buf(),
        source,
    })?;
    let paths = Paths {
        ca_cert: dir.join("ca.crt"),
        ca_key: dir.join("ca.key"),
        cert: dir.join("tls.crt"),
        key: dir.join("tls.key"),
    };
    write_file(&paths.ca_cert, &bundle.ca_cert, false)?;
    write_file(&paths.ca_key, &bundle.ca_key, true)?;
    write_file(&paths.cert, &bundle.cert, false)?;
    write_file(&paths.key, &bundle.key, true)?;
    Ok(paths)
}

fn write_file(path: &Path, contents: &str, private: bool) -> Result<(), Error> {
    let err = |source| Error::Write {
        path: path.to_path_buf(),
        source,
    };
    std::fs::write(path, contents).map_err(err)?;
    #[cfg(unix)]
    if private {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(err)?;
    }
    #[cfg(not(unix))]
    let _ = private;
    Ok(())
}

/// Runs `graceful-drain certs`.
pub async fn run(args: Args, _shutdown: crate::runtime::Shutdown) -> anyhow::Result<()> {
    let Args {
        out,
        mut dns_names,
        ips,
        namespace,
        service,
    } = args;
    if dns_names.is_empty() {
        dns_names = service_dns_names(&service, &namespace);
        dns_names.push("localhost".to_string());
    }
    let bundle = generate("graceful-drain webhook", &dns_names, &ips)?;
    let paths = write(&bundle, &out)?;
    println!(
        "wrote {}, {}, {}, {} (serving names: {})",
        paths.ca_cert.display(),
        paths.ca_key.display(),
        paths.cert.display(),
        paths.key.display(),
        dns_names.join(", ")
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serving_certificate_chains_to_the_ca_and_names_the_service() {
        let names = service_dns_names("wh", "ns");
        let bundle = generate("test", &names, &[IpAddr::from([127, 0, 0, 1])]).unwrap();
        let (_, ca_pem) = x509_parser::pem::parse_x509_pem(bundle.ca_cert.as_bytes()).unwrap();
        let ca = ca_pem.parse_x509().unwrap();
        let (_, pem) = x509_parser::pem::parse_x509_pem(bundle.cert.as_bytes()).unwrap();
        let cert = pem.parse_x509().unwrap();
        assert!(ca.is_ca());
        assert!(!cert.is_ca());
        assert_eq!(cert.issuer(), ca.subject());
        cert.verify_signature(Some(ca.public_key())).unwrap();
        let san = cert.subject_alternative_name().unwrap().unwrap();
        let rendered = format!("{:?}", san.value.general_names);
        assert!(rendered.contains("wh.ns.svc"), "{rendered}");
        assert!(
            rendered.contains("127.0.0.1") || rendered.contains("[127, 0, 0, 1]"),
            "{rendered}"
        );
    }

    #[test]
    fn written_keys_are_private() {
        let dir = tempfile::tempdir().unwrap();
        let bundle = generate("test", &["localhost".to_string()], &[]).unwrap();
        let paths = write(&bundle, dir.path()).unwrap();
        assert_eq!(std::fs::read_to_string(&paths.cert).unwrap(), bundle.cert);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&paths.key).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
    }
}
