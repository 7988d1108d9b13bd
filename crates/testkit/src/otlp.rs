//! A collector for tests: an OTLP/HTTP receiver on loopback that keeps
//! every span it is sent (protobuf `ExportTraceServiceRequest`s on
//! `POST /v1/traces`, plain or over TLS), so a test can assert on real
//! exported traces.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use prost::Message;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

/// One received span, flattened.
#[derive(Clone, Debug)]
pub struct Span {
    /// The `service.name` of the process that sent it.
    pub service: String,
    /// The span's name.
    pub name: String,
    /// Hex trace id.
    pub trace_id: String,
    /// Hex span id.
    pub span_id: String,
    /// Hex parent span id (empty for a root).
    pub parent_id: String,
    /// Attributes, as text.
    pub attributes: HashMap<String, String>,
}

/// The receiver; it serves until the process ends.
pub struct Collector {
    /// Where it listens: pass `http://{addr}` as the OTLP endpoint.
    pub addr: SocketAddr,
    spans: Arc<Mutex<Vec<Span>>>,
    tls: bool,
    connections: Arc<AtomicU64>,
}

impl Collector {
    /// Starts a receiver on an ephemeral loopback port.
    pub fn start() -> Self {
        Self::listen(None)
    }

    /// The same receiver over TLS with `pair`, a server certificate for
    /// localhost ([`crate::pki::Ca::server`]): the exporting process must
    /// trust its CA (`SSL_CERT_FILE`).
    pub fn start_tls(pair: &crate::pki::Pair) -> Self {
        let certs = CertificateDer::pem_file_iter(&pair.cert)
            .expect("read the certificate")
            .collect::<Result<Vec<_>, _>>()
            .expect("a PEM certificate");
        let key = PrivateKeyDer::from_pem_file(&pair.key).expect("a PEM key");
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("TLS versions")
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .expect("the collector's certificate");
        Self::listen(Some(Arc::new(config)))
    }

    fn listen(tls: Option<Arc<rustls::ServerConfig>>) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the collector");
        let addr = listener.local_addr().unwrap();
        let spans: Arc<Mutex<Vec<Span>>> = Arc::default();
        let connections = Arc::new(AtomicU64::new(0));
        let is_tls = tls.is_some();
        let (kept, accepted) = (spans.clone(), connections.clone());
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                accepted.fetch_add(1, Ordering::Relaxed);
                let (kept, tls) = (kept.clone(), tls.clone());
                std::thread::spawn(move || match tls {
                    None => serve(stream, &kept),
                    Some(config) => {
                        let tls = rustls::ServerConnection::new(config).expect("a TLS session");
                        serve(rustls::StreamOwned::new(tls, stream), &kept)
                    }
                });
            }
        });
        Self {
            addr,
            spans,
            tls: is_tls,
            connections,
        }
    }

    /// `http://ADDR`, for `--otlp-endpoint` (`https://localhost:PORT`
    /// for a collector started with [`Collector::start_tls`]).
    pub fn endpoint(&self) -> String {
        if self.tls {
            format!("https://localhost:{}", self.addr.port())
        } else {
            format!("http://{}", self.addr)
        }
    }

    /// How many connections it accepted (whether or not their TLS
    /// handshake completed).
    pub fn connections(&self) -> u64 {
        self.connections.load(Ordering::Relaxed)
    }

    /// Every span received so far.
    pub fn spans(&self) -> Vec<Span> {
        self.spans.lock().unwrap().clone()
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn text(v: &Option<opentelemetry_proto::tonic::common::v1::AnyValue>) -> String {
    match v.as_ref().and_then(|v| v.value.as_ref()) {
        Some(Value::StringValue(s)) => s.clone(),
        Some(Value::IntValue(i)) => i.to_string(),
        Some(Value::BoolValue(b)) => b.to_string(),
        Some(Value::DoubleValue(d)) => d.to_string(),
        Some(other) => format!("{other:?}"),
        None => String::new(),
    }
}

/// Answers every request on one connection (keep-alive) until it closes.
fn serve(stream: impl Read + Write, kept: &Mutex<Vec<Span>>) {
    let mut reader = BufReader::new(stream);
    loop {
        let mut length = 0usize;
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        loop {
            let mut header = String::new();
            if reader.read_line(&mut header).unwrap_or(0) == 0 {
                return;
            }
            let header = header.trim_end();
            if header.is_empty() {
                break;
            }
            if let Some((k, v)) = header.split_once(':') {
                if k.eq_ignore_ascii_case("content-length") {
                    length = v.trim().parse().unwrap_or(0);
                }
            }
        }
        let mut body = vec![0; length];
        if reader.read_exact(&mut body).is_err() {
            return;
        }
        if let Ok(req) = ExportTraceServiceRequest::decode(body.as_slice()) {
            let mut spans = kept.lock().unwrap();
            for rs in req.resource_spans {
                let service = rs
                    .resource
                    .iter()
                    .flat_map(|r| &r.attributes)
                    .find(|a| a.key == "service.name")
                    .map(|a| text(&a.value))
                    .unwrap_or_default();
                for ss in rs.scope_spans {
                    for s in ss.spans {
                        spans.push(Span {
                            service: service.clone(),
                            name: s.name,
                            trace_id: hex(&s.trace_id),
                            span_id: hex(&s.span_id),
                            parent_id: hex(&s.parent_span_id),
                            attributes: s
                                .attributes
                                .iter()
                                .map(|a| (a.key.clone(), text(&a.value)))
                                .collect(),
                        });
                    }
                }
            }
        }
        let answer =
            "HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\ncontent-length: 0\r\n\r\n";
        let writer = reader.get_mut();
        if writer.write_all(answer.as_bytes()).is_err() || writer.flush().is_err() {
            return;
        }
    }
}
