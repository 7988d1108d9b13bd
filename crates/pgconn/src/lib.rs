//! Connections to PostgreSQL configured the way libpq users already do it,
//! for every place Baton connects (the cluster store, `admin restore
//! --floor-from`, the statement service, the benchmarks):
//!
//! - `sslmode` = `disable`, `prefer` (the default, as in libpq: TLS if the
//!   server offers it), `require` (encrypted; the certificate is checked
//!   against `sslrootcert` when one is given, as libpq does), `verify-ca`
//!   (the chain must lead to `sslrootcert`) or `verify-full` (and the
//!   certificate must name the host);
//! - `sslrootcert`, `sslcert`, `sslkey` (PEM files; a client certificate
//!   for servers that ask for one);
//! - in a `postgres://` URL's query or a `key=value` string, else from
//!   `PGSSLMODE`, `PGSSLROOTCERT`, `PGSSLCERT`, `PGSSLKEY`.
//!
//! TLS is rustls (the stack the server already uses) through
//! `tokio-postgres-rustls`. The settings are taken out of the string here
//! because `tokio_postgres::Config` knows neither `verify-ca` and
//! `verify-full` nor the file settings; that parsing, and the two
//! certificate verifiers libpq's modes need beyond rustls's own, are what
//! is written by hand.

use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::CryptoProvider;
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme,
};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use tokio_postgres::Client;
use tokio_postgres_rustls::MakeRustlsConnect;

/// libpq's `sslmode`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SslMode {
    /// Plain text.
    Disable,
    /// TLS if the server offers it, plain text otherwise.
    Prefer,
    /// TLS; the certificate is checked only if `sslrootcert` is given.
    Require,
    /// TLS with a certificate signed by `sslrootcert`.
    VerifyCa,
    /// As `VerifyCa`, and the certificate names the host.
    VerifyFull,
}

impl SslMode {
    const NAMES: [(&'static str, SslMode); 5] = [
        ("disable", SslMode::Disable),
        ("prefer", SslMode::Prefer),
        ("require", SslMode::Require),
        ("verify-ca", SslMode::VerifyCa),
        ("verify-full", SslMode::VerifyFull),
    ];

    fn parse(s: &str) -> Result<Self, PgConnError> {
        Self::NAMES
            .iter()
            .find(|(n, _)| *n == s)
            .map(|(_, m)| *m)
            .ok_or_else(|| {
                PgConnError(format!(
                    "sslmode {s:?} is not one of disable, prefer, require, verify-ca, verify-full"
                ))
            })
    }
}

/// A setting that does not hold, named with its cause.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PgConnError(pub String);

impl std::fmt::Display for PgConnError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for PgConnError {}

/// Where to connect and how: the rest of the string as tokio-postgres reads
/// it, and the TLS the SSL settings ask for.
#[derive(Clone)]
pub struct Target {
    /// Host, port, user, database, timeouts...: adjust before connecting.
    pub config: tokio_postgres::Config,
    mode: SslMode,
    tls: MakeRustlsConnect,
}

impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Target")
            .field("hosts", &self.config.get_hosts())
            .field("mode", &self.mode)
            .finish()
    }
}

/// The SSL settings found in a connection string (or the environment).
#[derive(Default, Debug, PartialEq, Eq)]
struct Ssl {
    mode: Option<String>,
    rootcert: Option<String>,
    cert: Option<String>,
    key: Option<String>,
}

impl Ssl {
    fn take(&mut self, key: &str, value: String) -> bool {
        let slot = match key {
            "sslmode" => &mut self.mode,
            "sslrootcert" => &mut self.rootcert,
            "sslcert" => &mut self.cert,
            "sslkey" => &mut self.key,
            _ => return false,
        };
        *slot = Some(value);
        true
    }

    fn or_env(mut self) -> Self {
        let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        self.mode = self.mode.or_else(|| env("PGSSLMODE"));
        self.rootcert = self.rootcert.or_else(|| env("PGSSLROOTCERT"));
        self.cert = self.cert.or_else(|| env("PGSSLCERT"));
        self.key = self.key.or_else(|| env("PGSSLKEY"));
        self
    }
}

/// Splits the SSL settings off a `postgres://` URL (from its query).
fn split_url(conninfo: &str) -> (String, Ssl) {
    let mut ssl = Ssl::default();
    let Some((base, query)) = conninfo.split_once('?') else {
        return (conninfo.to_string(), ssl);
    };
    let mut kept = url::form_urlencoded::Serializer::new(String::new());
    let mut any = false;
    for (k, v) in url::form_urlencoded::parse(query.as_bytes()) {
        if !ssl.take(&k, v.to_string()) {
            kept.append_pair(&k, &v);
            any = true;
        }
    }
    let rest = if any {
        format!("{base}?{}", kept.finish())
    } else {
        base.to_string()
    };
    (rest, ssl)
}

/// Splits the SSL settings off a `key=value` string (values may be
/// single-quoted, with `\` escapes, as libpq writes them).
fn split_pairs(conninfo: &str) -> Result<(String, Ssl), PgConnError> {
    let mut ssl = Ssl::default();
    let mut kept: Vec<String> = Vec::new();
    let mut chars = conninfo.chars().peekable();
    loop {
        while chars.peek().is_some_and(|c| c.is_whitespace()) {
            chars.next();
        }
        if chars.peek().is_none() {
            break;
        }
        let key: String =
            std::iter::from_fn(|| chars.next_if(|c| *c != '=' && !c.is_whitespace())).collect();
        while chars.peek().is_some_and(|c| c.is_whitespace()) {
            chars.next();
        }
        if chars.next() != Some('=') {
            return Err(PgConnError(format!(
                "the connection string's {key:?} has no `=value`"
            )));
        }
        while chars.peek().is_some_and(|c| c.is_whitespace()) {
            chars.next();
        }
        let mut value = String::new();
        if chars.peek() == Some(&'\'') {
            chars.next();
            loop {
                match chars.next() {
                    Some('\\') => value.extend(chars.next()),
                    Some('\'') => break,
                    Some(c) => value.push(c),
                    None => {
                        return Err(PgConnError(format!(
                            "the connection string's {key:?} has an unterminated quote"
                        )))
                    }
                }
            }
        } else {
            value = std::iter::from_fn(|| chars.next_if(|c| !c.is_whitespace())).collect();
        }
        if !ssl.take(&key, value.clone()) {
            let quoted = value.replace('\\', "\\\\").replace('\'', "\\'");
            kept.push(format!("{key}='{quoted}'"));
        }
    }
    Ok((kept.join(" "), ssl))
}

/// Reads a connection string: a `postgres://` (or `postgresql://`) URL or
/// `key=value` pairs, with libpq's SSL settings.
pub fn parse(conninfo: &str) -> Result<Target, PgConnError> {
    let (rest, ssl) =
        if conninfo.starts_with("postgres://") || conninfo.starts_with("postgresql://") {
            split_url(conninfo)
        } else {
            split_pairs(conninfo)?
        };
    let ssl = ssl.or_env();
    let mode = match &ssl.mode {
        Some(m) => SslMode::parse(m)?,
        None => SslMode::Prefer,
    };
    let mut config: tokio_postgres::Config = rest
        .parse()
        .map_err(|e: tokio_postgres::Error| PgConnError(format!("the connection string: {e}")))?;
    config.ssl_mode(match mode {
        SslMode::Disable => tokio_postgres::config::SslMode::Disable,
        SslMode::Prefer => tokio_postgres::config::SslMode::Prefer,
        _ => tokio_postgres::config::SslMode::Require,
    });
    let tls = MakeRustlsConnect::new(client_config(mode, &ssl)?);
    Ok(Target { config, mode, tls })
}

fn read(setting: &str, path: &str) -> Result<Vec<u8>, PgConnError> {
    std::fs::read(path).map_err(|e| PgConnError(format!("{setting} {path}: cannot read it: {e}")))
}

fn client_config(mode: SslMode, ssl: &Ssl) -> Result<ClientConfig, PgConnError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let roots = match &ssl.rootcert {
        Some(path) => {
            let pem = read("sslrootcert", path)?;
            let mut roots = RootCertStore::empty();
            let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&pem)
                .collect::<Result<_, _>>()
                .map_err(|e| PgConnError(format!("sslrootcert {path}: not PEM certificates: {e}")))?;
            let (added, _) = roots.add_parsable_certificates(certs);
            if added == 0 {
                return Err(PgConnError(format!("sslrootcert {path}: holds no certificate")));
            }
            Some(Arc::new(roots))
        }
        None if matches!(mode, SslMode::VerifyCa | SslMode::VerifyFull) => {
            return Err(PgConnError(format!(
                "sslmode={} needs sslrootcert (or PGSSLROOTCERT): the file of CA certificates to trust",
                SslMode::NAMES.iter().find(|(_, m)| *m == mode).map_or("", |(n, _)| n)
            )))
        }
        None => None,
    };
    let verifier: Arc<dyn ServerCertVerifier> = match roots {
        None => Arc::new(AnyCertificate(provider.clone())),
        Some(roots) => {
            let webpki = WebPkiServerVerifier::builder_with_provider(roots, provider.clone())
                .build()
                .map_err(|e| PgConnError(format!("sslrootcert: {e}")))?;
            if mode == SslMode::VerifyFull {
                webpki
            } else {
                Arc::new(AnyName(webpki))
            }
        }
    };
    let builder = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| PgConnError(format!("TLS: {e}")))?
        .dangerous()
        .with_custom_certificate_verifier(verifier);
    match (&ssl.cert, &ssl.key) {
        (None, None) => Ok(builder.with_no_client_auth()),
        (Some(cert), Some(key)) => {
            let pem = read("sslcert", cert)?;
            let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&pem)
                .collect::<Result<_, _>>()
                .map_err(|e| PgConnError(format!("sslcert {cert}: not PEM certificates: {e}")))?;
            let key_pem = read("sslkey", key)?;
            let key_der = PrivateKeyDer::from_pem_slice(&key_pem)
                .map_err(|e| PgConnError(format!("sslkey {key}: not a PEM private key: {e}")))?;
            builder
                .with_client_auth_cert(chain, key_der)
                .map_err(|e| PgConnError(format!("sslcert {cert} with sslkey {key}: {e}")))
        }
        (Some(_), None) => Err(PgConnError("sslcert needs sslkey (or PGSSLKEY)".into())),
        (None, Some(_)) => Err(PgConnError("sslkey needs sslcert (or PGSSLCERT)".into())),
    }
}

impl Target {
    /// The `sslmode` in force.
    pub fn ssl_mode(&self) -> SslMode {
        self.mode
    }

    /// Connects and drives the connection on the current runtime (its end
    /// is logged at `debug`).
    pub async fn connect(&self) -> Result<Client, tokio_postgres::Error> {
        let (client, connection) = self.config.connect(self.tls.clone()).await?;
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, "PostgreSQL connection closed");
            }
        });
        Ok(client)
    }
}

/// Why a connection failed: a setting, or the attempt (with its cause).
#[derive(Debug)]
pub enum ConnectError {
    /// A setting of the string or the environment.
    Settings(PgConnError),
    /// The server or the network (a TLS refusal included).
    Connect(tokio_postgres::Error),
}

impl std::fmt::Display for ConnectError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ConnectError::Settings(e) => e.fmt(f),
            ConnectError::Connect(e) => f.write_str(&describe(e)),
        }
    }
}

impl std::error::Error for ConnectError {}

/// [`parse`] then [`Target::connect`].
pub async fn connect(conninfo: &str) -> Result<Client, ConnectError> {
    parse(conninfo)
        .map_err(ConnectError::Settings)?
        .connect()
        .await
        .map_err(ConnectError::Connect)
}

/// A connection error with its causes (a TLS refusal says why: an unknown
/// issuer, a name the certificate does not hold).
pub fn describe(e: &tokio_postgres::Error) -> String {
    if let Some(db) = e.as_db_error() {
        let detail = db.detail().map_or(String::new(), |d| format!(" ({d})"));
        return format!(
            "{}: {}{detail} (SQLSTATE {})",
            db.severity(),
            db.message(),
            db.code().code()
        );
    }
    baton_telemetry::error_chain(e)
}

/// `require` and `prefer` without `sslrootcert`: encrypted, not verified
/// (as libpq does). Signatures are still checked.
#[derive(Debug)]
struct AnyCertificate(Arc<CryptoProvider>);

impl ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// `verify-ca`: the chain must lead to a trusted CA; the name is not
/// checked.
#[derive(Debug)]
struct AnyName(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for AnyName {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp, now)
        {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ssl_settings_come_off_urls_and_pairs() {
        let (rest, ssl) = split_url(
            "postgres://u:p@db:5432/x?sslmode=verify-full&application_name=a&sslrootcert=%2Fca.pem",
        );
        assert_eq!(rest, "postgres://u:p@db:5432/x?application_name=a");
        assert_eq!(ssl.mode.as_deref(), Some("verify-full"));
        assert_eq!(ssl.rootcert.as_deref(), Some("/ca.pem"));
        let (rest, ssl) =
            split_pairs("host=db user=postgres sslmode = require sslkey='/k y.pem' dbname=x")
                .unwrap();
        assert_eq!(ssl.mode.as_deref(), Some("require"));
        assert_eq!(ssl.key.as_deref(), Some("/k y.pem"));
        assert_eq!(rest, "host='db' user='postgres' dbname='x'");
        let (_, ssl) = split_pairs(r"host=db password='a\'b' sslmode=disable").unwrap();
        assert_eq!(ssl.mode.as_deref(), Some("disable"));
        assert!(split_pairs("host=db sslmode").is_err());
        assert!(split_pairs("host='db").is_err());
    }

    #[test]
    fn bad_settings_name_the_setting_and_the_cause() {
        let e = parse("host=db sslmode=verify").unwrap_err().0;
        assert!(e.contains("sslmode \"verify\" is not one of"), "{e}");
        let e = parse("host=db sslmode=verify-full").unwrap_err().0;
        assert!(e.contains("needs sslrootcert"), "{e}");
        let e = parse("host=db sslmode=verify-ca sslrootcert=/nonexistent/ca.pem")
            .unwrap_err()
            .0;
        assert!(
            e.contains("sslrootcert /nonexistent/ca.pem: cannot read it"),
            "{e}"
        );
        let e = parse("host=db sslcert=/a.pem").unwrap_err().0;
        assert!(e.contains("sslcert needs sslkey"), "{e}");
        assert_eq!(
            parse("host=db").unwrap().ssl_mode(),
            SslMode::Prefer,
            "libpq's default"
        );
        assert_eq!(
            parse("postgres://db/x?sslmode=disable").unwrap().ssl_mode(),
            SslMode::Disable
        );
    }
}
