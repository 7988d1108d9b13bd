//! Addresses: the proxies in front of Baton and PostgreSQL.

use std::net::SocketAddr;
use std::str::FromStr;

use baton_faults::Direction;

pub fn direction(to_server: bool) -> Direction {
    if to_server {
        Direction::ClientToServer
    } else {
        Direction::ServerToClient
    }
}

pub fn free_port() -> Result<SocketAddr, String> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    l.local_addr().map_err(|e| e.to_string())
}

/// The worker's connection string with the host and port of its proxy (the
/// port left as `{port}`), and the database's own address.
pub async fn postgres_via_proxy(url: &str) -> Result<(String, SocketAddr), String> {
    let config = tokio_postgres::Config::from_str(url)
        .map_err(|e| format!("--database-url is not a PostgreSQL connection string: {e}"))?;
    let host = match config.get_hosts().first() {
        Some(tokio_postgres::config::Host::Tcp(h)) => h.clone(),
        _ => {
            return Err(
                "chaos puts a proxy in front of PostgreSQL, so --database-url needs a TCP host (host=127.0.0.1, not a socket directory)".into(),
            )
        }
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    let upstream = tokio::net::lookup_host((host.as_str(), port))
        .await
        .map_err(|e| format!("cannot resolve {host}: {e}"))?
        .next()
        .ok_or_else(|| format!("cannot resolve {host}"))?;
    let quote = |s: &str| format!("'{}'", s.replace('\\', "\\\\").replace('\'', "\\'"));
    let mut out = String::from("host=127.0.0.1 port={port}");
    if let Some(user) = config.get_user() {
        out += &format!(" user={}", quote(user));
    }
    if let Some(db) = config.get_dbname() {
        out += &format!(" dbname={}", quote(db));
    }
    if let Some(pw) = config.get_password() {
        out += &format!(" password={}", quote(&String::from_utf8_lossy(pw)));
    }
    Ok((out, upstream))
}
