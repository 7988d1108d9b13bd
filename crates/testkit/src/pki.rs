//! Certificates for TLS tests, made on the spot (rcgen): a CA, a server
//! certificate for 127.0.0.1, client certificates by common name, and
//! the broken ones (another CA, expired), written as PEM files.

use std::path::{Path, PathBuf};

use rcgen::{
    date_time_ymd, BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair,
};
use sha2::Digest;

/// A certificate authority that signs certificates into a directory.
pub struct Ca {
    issuer: Issuer<'static, KeyPair>,
    /// The CA certificate (PEM file).
    pub cert: PathBuf,
    dir: PathBuf,
}

/// A certificate and its key, as PEM files.
#[derive(Clone, Debug)]
pub struct Pair {
    /// The certificate.
    pub cert: PathBuf,
    /// Its private key.
    pub key: PathBuf,
}

fn params(cn: &str, sans: &[&str]) -> CertificateParams {
    let mut p = CertificateParams::new(sans.iter().map(|s| s.to_string()).collect::<Vec<_>>())
        .expect("valid names");
    p.distinguished_name.push(DnType::CommonName, cn);
    p
}

impl Ca {
    /// A new CA named `name`, its certificate written to `dir/name.pem`.
    pub fn new(dir: &Path, name: &str) -> Self {
        let key = KeyPair::generate().expect("key");
        let mut p = params(name, &[]);
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let cert = p.self_signed(&key).expect("self-signed CA");
        let path = dir.join(format!("{name}.pem"));
        std::fs::write(&path, cert.pem()).expect("write CA");
        Self {
            issuer: Issuer::new(p, key),
            cert: path,
            dir: dir.to_path_buf(),
        }
    }

    fn sign(&self, file: &str, mut p: CertificateParams, expired: bool) -> Pair {
        if expired {
            p.not_before = date_time_ymd(2020, 1, 1);
            p.not_after = date_time_ymd(2021, 1, 1);
        }
        let key = KeyPair::generate().expect("key");
        let cert = p.signed_by(&key, &self.issuer).expect("sign");
        let pair = Pair {
            cert: self.dir.join(format!("{file}.pem")),
            key: self.dir.join(format!("{file}.key")),
        };
        std::fs::write(&pair.cert, cert.pem()).expect("write cert");
        std::fs::write(&pair.key, key.serialize_pem()).expect("write key");
        pair
    }

    /// A server certificate for 127.0.0.1 and localhost.
    pub fn server(&self, file: &str, expired: bool) -> Pair {
        let mut p = params("baton-server", &["127.0.0.1", "localhost"]);
        p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        self.sign(file, p, expired)
    }

    /// A server certificate for `names` only (host names or addresses).
    pub fn server_for(&self, file: &str, names: &[&str]) -> Pair {
        let mut p = params("baton-server", names);
        p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        self.sign(file, p, false)
    }

    /// A client certificate whose subject common name is `cn`.
    pub fn client(&self, file: &str, cn: &str, expired: bool) -> Pair {
        let mut p = params(cn, &[]);
        p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        self.sign(file, p, expired)
    }
}

/// The hex SHA-256 of `token`, as an auth file's `token_sha256` wants it.
pub fn token_sha256(token: &str) -> String {
    sha2::Sha256::digest(token.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}
