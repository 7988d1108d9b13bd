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

pub fn free_port() -> anyhow::Result<SocketAddr> {
    let l = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(l.local_addr()?)
}

/// The worker's connection string with the host and port of its proxy (the
/// port left as `{port}`), and the database's own address.
pub async fn postgres_via_proxy(url: &str) -> anyhow::Result<(String, SocketAddr)> {
    let config = tokio_postgres::Config::from_str(url).map_err(|e| {
        anyhow::anyhow!("--database-url is not a PostgreSQL connection string: {e}")
    })?;
    let host = match config.get_hosts().first() {
        Some(tokio_postgres::config::Host::Tcp(h)) => h.clone(),
        _ => {
            anyhow::bail!("chaos puts a proxy in front of PostgreSQL, so --database-url needs a TCP host (host=127.0.0.1, not a socket directory)")
        }
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    let upstream = tokio::net::lookup_host((host.as_str(), port))
        .await
        .map_err(|e| anyhow::anyhow!("cannot resolve {host}: {e}"))?
        .next()
        .ok_or_else(|| anyhow::anyhow!("cannot resolve {host}"))?;
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
