//! TLS on the gRPC and HTTP ports (rustls with ring).
//!
//! Handshakes run in a task per connection (bounded by the handshake
//! timeout), so a slow or silent peer never holds up the accept loop. A
//! verified client certificate's subject common name is kept with the
//! connection: with an auth file, it names the principal of a call that
//! carries no bearer token.
//!
//! Client certificates are checked after the handshake, not in it: the
//! handshake proves the peer holds the certificate's key (rustls checks
//! the signature), then the chain is verified against `--tls-client-ca`,
//! and a connection whose certificate is missing or refused gets every
//! request answered `UNAUTHENTICATED` with the reason (`conn::check`).
//! Refused inside the handshake, a TLS 1.3 client would only see its
//! connection close, with no word on why.
//!
//! A peer that speaks plain text to a TLS port is answered in its own
//! protocol before the connection closes, so its error says what to fix:
//! on the gRPC port its first call is answered `UNAUTHENTICATED` ("this
//! port requires TLS") in a minimal HTTP/2 exchange, on the HTTP port with
//! a `400`.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::client::danger::HandshakeSignatureValid;
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::WebPkiClientVerifier;
use rustls::{
    DigitallySignedStruct, DistinguishedName, RootCertStore, ServerConfig, SignatureScheme,
};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, UnixTime};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio_rustls::TlsAcceptor;

/// The certificate files `baton serve` was given.
#[derive(Clone, Debug)]
pub struct TlsFiles {
    /// PEM certificate chain, leaf first.
    pub cert: PathBuf,
    /// PEM private key of the leaf.
    pub key: PathBuf,
    /// PEM CA certificates: when set, every gRPC connection must present a
    /// client certificate signed by one of them.
    pub client_ca: Option<PathBuf>,
}

/// The first byte of every TLS handshake record.
const TLS_HANDSHAKE_RECORD: u8 = 0x16;

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Why a port's TLS material was not loaded; each names the flag and the
/// file it came from.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file did not read as PEM, or a certificate was refused.
    #[error("{flag} {}: {reason}", path.display())]
    File {
        flag: &'static str,
        path: std::path::PathBuf,
        reason: String,
    },
    /// The certificate and the key do not belong together.
    #[error("--tls-cert/--tls-key do not make a usable pair: {0}")]
    Pair(rustls::Error),
    /// rustls refused its own defaults (it never does with ring).
    #[error("TLS setup: {0}")]
    Setup(rustls::Error),
}

impl TlsError {
    fn file(flag: &'static str, path: &Path, reason: impl std::fmt::Display) -> Self {
        Self::File {
            flag,
            path: path.to_owned(),
            reason: reason.to_string(),
        }
    }
}

fn certs(path: &Path, flag: &'static str) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .map_err(|e| TlsError::file(flag, path, e))?;
    if certs.is_empty() {
        return Err(TlsError::file(
            flag,
            path,
            "no PEM certificate (-----BEGIN CERTIFICATE-----) in it",
        ));
    }
    Ok(certs)
}

/// What a connection's client certificate proved.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClientCert {
    /// The port does not ask for one.
    NotAsked,
    /// Asked for, none sent.
    Missing,
    /// Sent, not accepted: why.
    Refused(Arc<str>),
    /// Verified; its subject common name, if it has one.
    Verified(Option<Arc<str>>),
}

/// Asks for a client certificate and checks the handshake signature, but
/// leaves the chain to [`ClientCert`] after the handshake (see the module
/// documentation).
#[derive(Debug)]
struct AfterHandshake(Arc<dyn ClientCertVerifier>);

impl ClientCertVerifier for AfterHandshake {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        false
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.0.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        Ok(ClientCertVerified::assertion())
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

/// A port's TLS material in force: the acceptor and, with client
/// certificates, their verifier.
pub struct Material {
    pub acceptor: TlsAcceptor,
    client_verifier: Option<Arc<dyn ClientCertVerifier>>,
}

/// A port's TLS: the material in force, swapped whole by [`Tls::reload`]
/// (SIGHUP). A connection takes the material in force when it is accepted
/// and keeps it; a reload that fails leaves the old material in force.
#[derive(Clone)]
pub struct Tls {
    current: Arc<std::sync::RwLock<Arc<Material>>>,
    files: TlsFiles,
    alpn: Vec<Vec<u8>>,
    client_auth: bool,
}

impl Tls {
    /// The material new connections get.
    pub fn current(&self) -> Arc<Material> {
        self.current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Reads the certificate, key and client CA files again; on success new
    /// connections use them. On failure the error names the file and the
    /// material in force stays.
    pub fn reload(&self) -> Result<(), TlsError> {
        let alpn: Vec<&[u8]> = self.alpn.iter().map(Vec::as_slice).collect();
        let material = material(&self.files, &alpn, self.client_auth)?;
        *self.current.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(material);
        Ok(())
    }
}

impl Material {
    /// What the peer's certificates (leaf first) prove.
    fn client_cert(&self, chain: Option<&[CertificateDer<'static>]>) -> ClientCert {
        let Some(verifier) = &self.client_verifier else {
            return ClientCert::NotAsked;
        };
        let Some((leaf, intermediates)) = chain.and_then(|c| c.split_first()) else {
            return ClientCert::Missing;
        };
        match verifier.verify_client_cert(leaf, intermediates, UnixTime::now()) {
            Ok(_) => ClientCert::Verified(common_name(leaf.as_ref()).map(Arc::from)),
            Err(e) => ClientCert::Refused(Arc::from(e.to_string())),
        }
    }
}

/// Builds a port's TLS for `alpn`; client certificates are asked for if
/// `files.client_ca` is set and `client_auth` is true.
pub fn server_tls(files: &TlsFiles, alpn: &[&[u8]], client_auth: bool) -> Result<Tls, TlsError> {
    let material = material(files, alpn, client_auth)?;
    Ok(Tls {
        current: Arc::new(std::sync::RwLock::new(Arc::new(material))),
        files: files.clone(),
        alpn: alpn.iter().map(|p| p.to_vec()).collect(),
        client_auth,
    })
}

fn material(files: &TlsFiles, alpn: &[&[u8]], client_auth: bool) -> Result<Material, TlsError> {
    let chain = certs(&files.cert, "--tls-cert")?;
    let key = PrivateKeyDer::from_pem_file(&files.key)
        .map_err(|e| TlsError::file("--tls-key", &files.key, e))?;
    let builder = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(TlsError::Setup)?;
    let mut client_verifier = None;
    let builder = match (&files.client_ca, client_auth) {
        (Some(ca), true) => {
            let mut roots = RootCertStore::empty();
            for c in certs(ca, "--tls-client-ca")? {
                roots
                    .add(c)
                    .map_err(|e| TlsError::file("--tls-client-ca", ca, e))?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider())
                .build()
                .map_err(|e| TlsError::file("--tls-client-ca", ca, e))?;
            client_verifier = Some(verifier.clone());
            builder.with_client_cert_verifier(Arc::new(AfterHandshake(verifier)))
        }
        _ => builder.with_no_client_auth(),
    };
    let mut config = builder
        .with_single_cert(chain, key)
        .map_err(TlsError::Pair)?;
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Ok(Material {
        acceptor: TlsAcceptor::from(Arc::new(config)),
        client_verifier,
    })
}

/// The subject common name of a DER certificate, if it has one.
pub fn common_name(der: &[u8]) -> Option<String> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    let cn = cert.subject().iter_common_name().next()?;
    cn.as_str().ok().map(str::to_string)
}

/// What a plain-text peer on a TLS port is told.
#[derive(Clone, Copy, Debug)]
pub enum PlainAnswer {
    /// Its first gRPC call answered `UNAUTHENTICATED` with a message.
    Http2,
    /// An HTTP/1.1 `400` with a message.
    Http1,
}

const PLAIN_MESSAGE: &str = "this port requires TLS: connect with https:// and the server's CA";

/// The HTTP/2 client connection preface.
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// Most bytes read from a plain-text peer before giving up on it.
const PLAIN_READ_LEN_BYTES_MAX: usize = 64 * 1024;

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len();
    let mut out = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags];
    out.extend_from_slice(&(stream & 0x7fff_ffff).to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// An HPACK integer with an `n`-bit prefix (RFC 7541 §5.1).
fn hpack_int(out: &mut Vec<u8>, first: u8, n: u32, mut value: usize) {
    let max = (1usize << n) - 1;
    if value < max {
        out.push(first | value as u8);
        return;
    }
    out.push(first | max as u8);
    value -= max;
    while value >= 128 {
        out.push((value % 128) as u8 | 0x80);
        value /= 128;
    }
    out.push(value as u8);
}

/// A literal header field without indexing, new name (RFC 7541 §6.2.2).
fn hpack_literal(out: &mut Vec<u8>, name: &str, value: &str) {
    out.push(0);
    hpack_int(out, 0, 7, name.len());
    out.extend_from_slice(name.as_bytes());
    hpack_int(out, 0, 7, value.len());
    out.extend_from_slice(value.as_bytes());
}

/// A trailers-only gRPC answer on `stream`: `UNAUTHENTICATED` and the message.
fn grpc_refusal(stream: u32) -> Vec<u8> {
    let mut block = vec![0x88]; // `:status: 200`, static table entry 8
    hpack_literal(&mut block, "content-type", "application/grpc");
    hpack_literal(&mut block, "grpc-status", "16");
    hpack_literal(
        &mut block,
        "grpc-message",
        &PLAIN_MESSAGE.replace(' ', "%20"),
    );
    let mut out = frame(0x1, 0x4 | 0x1, stream, &block); // HEADERS, END_HEADERS | END_STREAM
    out.extend(frame(0x7, 0, 0, &[0, 0, 0, 0, 0, 0, 0, 0])); // GOAWAY, NO_ERROR
    out
}

/// Reads a plain HTTP/2 peer's preface and frames up to its first HEADERS
/// frame, and returns that frame's stream id.
async fn first_h2_stream(tcp: &mut TcpStream) -> io::Result<Option<u32>> {
    use tokio::io::AsyncReadExt;
    let mut preface = [0u8; 24];
    tcp.read_exact(&mut preface).await?;
    if preface != H2_PREFACE {
        return Ok(None);
    }
    tcp.write_all(&frame(0x4, 0, 0, &[])).await?; // our SETTINGS
    let mut read = 0usize;
    loop {
        let mut head = [0u8; 9];
        tcp.read_exact(&mut head).await?;
        let len = ((head[0] as usize) << 16) | ((head[1] as usize) << 8) | head[2] as usize;
        read += 9 + len;
        if read > PLAIN_READ_LEN_BYTES_MAX {
            return Ok(None);
        }
        let mut payload = vec![0u8; len];
        tcp.read_exact(&mut payload).await?;
        if head[3] == 0x1 {
            let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
            return Ok(Some(stream));
        }
    }
}

fn http1_refusal() -> Vec<u8> {
    format!(
        "HTTP/1.1 400 Bad Request\r\ncontent-type: text/plain\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{PLAIN_MESSAGE}\n",
        PLAIN_MESSAGE.len() + 1
    )
    .into_bytes()
}

/// Whether the peer started a TLS handshake; if it speaks plain text, it
/// is answered per `kind` and `false` is returned.
pub async fn starts_tls(tcp: &mut TcpStream, kind: PlainAnswer) -> io::Result<bool> {
    let mut first = [0u8; 1];
    let n = tcp.peek(&mut first).await?;
    if n == 1 && first[0] == TLS_HANDSHAKE_RECORD {
        return Ok(true);
    }
    if n == 1 {
        let answer = match kind {
            PlainAnswer::Http1 => Some(http1_refusal()),
            PlainAnswer::Http2 => first_h2_stream(tcp).await?.map(grpc_refusal),
        };
        if let Some(answer) = answer {
            tcp.write_all(&answer).await?;
        }
        let _ = tcp.shutdown().await;
        // Read what the peer sends until it hangs up (bounded by the
        // caller's timeout): closing with unread bytes would reset the
        // connection before the peer reads the answer.
        let _ = tokio::io::copy(tcp, &mut tokio::io::sink()).await;
    }
    Ok(false)
}

/// Accepts TLS on `io` (callers bound it in time, with the plain-text
/// check before it): the stream and what its client certificate proved.
pub async fn accept<IO>(
    tls: &Tls,
    io: IO,
) -> io::Result<(tokio_rustls::server::TlsStream<IO>, ClientCert)>
where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let material = tls.current();
    let stream = material.acceptor.accept(io).await?;
    let cert = material.client_cert(stream.get_ref().1.peer_certificates());
    Ok((stream, cert))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hpack_integers_follow_rfc_7541() {
        // C.1.1-C.1.3: 10 in a 5-bit prefix, 1337 in a 5-bit prefix, 42 in 8 bits.
        for (value, n, bytes) in [
            (10usize, 5, vec![0x0a]),
            (1337, 5, vec![0x1f, 0x9a, 0x0a]),
            (42, 8, vec![0x2a]),
        ] {
            let mut out = Vec::new();
            hpack_int(&mut out, 0, n, value);
            assert_eq!(out, bytes, "{value}");
        }
        let refusal = grpc_refusal(1);
        assert_eq!(
            &refusal[3..5],
            &[0x1, 0x5],
            "HEADERS with END_HEADERS | END_STREAM"
        );
        assert_eq!(&refusal[5..9], &[0, 0, 0, 1], "on the caller's stream");
    }
}
