//! How a client proves the server is the right one (TLS with a CA) and
//! who it is (a bearer token, or a client certificate).

use std::path::Path;
use std::time::Duration;

use tonic::metadata::{Ascii, MetadataValue};
use tonic::transport::{Certificate, ClientTlsConfig, Identity};

use crate::ClientError;

/// TLS and credentials for [`crate::Client::connect_with`]. The default is
/// plain HTTP/2 with no credentials. `Debug` never shows the token.
#[derive(Clone)]
pub struct ConnectOptions {
    pub(crate) tls: Option<ClientTlsConfig>,
    pub(crate) authorization: Option<MetadataValue<Ascii>>,
    pub(crate) dial_timeout: Duration,
}

/// How long a server has to answer a new connection before it is passed
/// over (see [`ConnectOptions::dial_timeout`]).
pub const DIAL_TIMEOUT_DEFAULT: Duration = Duration::from_secs(1);

impl Default for ConnectOptions {
    fn default() -> Self {
        Self {
            tls: None,
            authorization: None,
            dial_timeout: DIAL_TIMEOUT_DEFAULT,
        }
    }
}

impl std::fmt::Debug for ConnectOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnectOptions")
            .field("tls", &self.tls.is_some())
            .field("token", &self.authorization.as_ref().map(|_| "<redacted>"))
            .field("dial_timeout", &self.dial_timeout)
            .finish()
    }
}

fn read(path: &Path, flag: &str) -> Result<Vec<u8>, ClientError> {
    std::fs::read(path).map_err(|e| ClientError::Invalid(format!("{flag} {}: {e}", path.display())))
}

impl ConnectOptions {
    /// How long a server has to answer a new connection (its HTTP/2
    /// SETTINGS, or its TLS handshake) before the client passes it over
    /// and tries another; also how long an open connection may leave a
    /// PING unanswered before it is closed. Default 1 s; at least 1 ms.
    pub fn dial_timeout(mut self, timeout: Duration) -> Result<Self, ClientError> {
        if timeout.is_zero() {
            return Err(ClientError::Invalid(
                "the dial timeout is zero; it must be at least 1ms".into(),
            ));
        }
        self.dial_timeout = timeout;
        Ok(self)
    }

    /// Verify the server's certificate against this CA (PEM): TLS on.
    pub fn ca_pem(mut self, pem: &[u8]) -> Self {
        let tls = self.tls.take().unwrap_or_default();
        self.tls = Some(tls.ca_certificate(Certificate::from_pem(pem)));
        self
    }

    /// Present this client certificate and key (PEM) to a server that asks
    /// for one (`--tls-client-ca`).
    pub fn identity_pem(mut self, cert: &[u8], key: &[u8]) -> Self {
        let tls = self.tls.take().unwrap_or_default();
        self.tls = Some(tls.identity(Identity::from_pem(cert, key)));
        self
    }

    /// Send `authorization: Bearer TOKEN` with every request. Surrounding
    /// whitespace (a file's trailing newline) is not part of the token.
    pub fn token(mut self, token: &str) -> Result<Self, ClientError> {
        let token = token.trim();
        if token.is_empty() {
            return Err(ClientError::Invalid("the token is empty".into()));
        }
        let value = MetadataValue::try_from(format!("Bearer {token}")).map_err(|_| {
            ClientError::Invalid(
                "the token has characters a header cannot carry; use printable ASCII".into(),
            )
        })?;
        self.authorization = Some(value);
        Ok(self)
    }

    /// From the files the command line names: `--tls-ca`, `--tls-cert`
    /// with `--tls-key`, `--token-file`. Each error names the flag.
    pub fn from_files(
        ca: Option<&Path>,
        cert: Option<&Path>,
        key: Option<&Path>,
        token_file: Option<&Path>,
    ) -> Result<Self, ClientError> {
        let mut options = Self::default();
        if let Some(ca) = ca {
            options = options.ca_pem(&read(ca, "--tls-ca")?);
        }
        match (cert, key) {
            (Some(cert), Some(key)) => {
                options =
                    options.identity_pem(&read(cert, "--tls-cert")?, &read(key, "--tls-key")?);
            }
            (None, None) => {}
            _ => {
                return Err(ClientError::Invalid(
                    "--tls-cert and --tls-key go together: give both or neither".into(),
                ))
            }
        }
        if let Some(path) = token_file {
            let text = String::from_utf8(read(path, "--token-file")?).map_err(|_| {
                ClientError::Invalid(format!("--token-file {}: not UTF-8 text", path.display()))
            })?;
            options = options.token(&text)?;
        }
        Ok(options)
    }

    /// Refuses a URL whose scheme contradicts the TLS settings.
    pub(crate) fn check_scheme(&self, url: &str) -> Result<(), ClientError> {
        match (self.tls.is_some(), url.starts_with("https://")) {
            (true, false) => Err(ClientError::Invalid(format!(
                "server url {url:?}: TLS settings were given (a CA or a client certificate), so the url must start with https://"
            ))),
            (false, true) => Err(ClientError::Invalid(format!(
                "server url {url:?}: https:// needs the CA that signed the server's certificate (--tls-ca or BATON_TLS_CA)"
            ))),
            _ => Ok(()),
        }
    }
}

/// A connection error's text with what to do about the usual TLS mistakes.
pub(crate) fn explain(message: &str) -> String {
    let hint = if message.contains("UnknownIssuer") {
        " (the server's certificate is not signed by the CA given with --tls-ca)"
    } else if message.contains("Expired") || message.contains("certificate expired") {
        " (a certificate has expired)"
    } else if message.contains("NotValidForName") {
        " (the server's certificate does not name the host in the url)"
    } else if message.contains("inadequate security")
        || message.contains("INADEQUATE_SECURITY")
        || message.contains("InadequateSecurity")
        || message.contains("this port requires TLS")
    {
        " (the server requires TLS: connect with https:// and --tls-ca)"
    } else if message.contains("CertificateRequired") || message.contains("certificate required") {
        " (the server requires a client certificate: --tls-cert and --tls-key)"
    } else if message.contains("UnknownCA") || message.contains("unknown ca") {
        " (the server does not trust the CA of the client certificate)"
    } else if message.contains("InvalidContentType") || message.contains("corrupt message") {
        " (the server does not speak TLS: connect with http://)"
    } else {
        ""
    };
    format!("{message}{hint}")
}
