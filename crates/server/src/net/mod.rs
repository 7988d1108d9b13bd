//! The transport under the gRPC port: accepted connections and their
//! limits (`conn.rs`) and TLS on both ports (`tls.rs`).

pub(crate) mod conn;
pub(crate) mod tls;
