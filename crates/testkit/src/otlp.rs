//! A collector for tests: an OTLP/HTTP receiver on loopback that keeps
//! every span it is sent (protobuf `ExportTraceServiceRequest`s on
//! `POST /v1/traces`), so a test can assert on real exported traces.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use prost::Message;

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
}

impl Collector {
    /// Starts a receiver on an ephemeral loopback port.
    pub fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the collector");
        let addr = listener.local_addr().unwrap();
        let spans: Arc<Mutex<Vec<Span>>> = Arc::default();
        let kept = spans.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let kept = kept.clone();
                std::thread::spawn(move || serve(stream, &kept));
            }
        });
        Self { addr, spans }
    }

    /// `http://ADDR`, for `--otlp-endpoint`.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
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
fn serve(stream: TcpStream, kept: &Mutex<Vec<Span>>) {
    let mut writer = stream.try_clone().expect("clone the stream");
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
        if writer.write_all(answer.as_bytes()).is_err() {
            return;
        }
    }
}
